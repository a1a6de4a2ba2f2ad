"""Leases under faults: a heartbeat that survives every kind of storage error, a holder that stops
before its lease can go stale, fenced status writes, and takeover of a dead local holder."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from conftest import WriteConfig, make_step, plant_crashed_holder, wait_until
from faulty_fs import FaultyFileSystem
from gate_runner import gate_step
from gcsfs.retry import HttpError
from paths import SUPPORT

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, StepFailedError, read_status, storage
from executor.errors import LeaseLostError
from executor.store.events import StatusEvent, StepStatus, append_event, read_events
from executor.store.lease import Heartbeat, Lease, LeaseSettings

RUNNER = str(SUPPORT / "gate_runner.py")


def client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")  # fmt: skip


# One of each family a storage client raises; none of them is an OSError but the first two.
FAMILIES = {
    "OSError": lambda: OSError(errno.EIO, "input/output error"),
    "PermissionError": lambda: PermissionError("token expired"),
    "gcsfs.HttpError": lambda: HttpError({"code": 403, "message": "forbidden"}),
    "botocore.ClientError": lambda: client_error(403, "AccessDenied"),
    "RuntimeError": lambda: RuntimeError("a bug in a storage plugin"),
}
# Faults that last: transient ones make each storage call retry inside itself before it gives up.
LASTING = {
    "OSError": FAMILIES["OSError"],
    "gcsfs.HttpError-503": lambda: HttpError({"code": 503, "message": "backend error"}),
    "botocore.ClientError-503": lambda: client_error(503, "SlowDown"),
    "RuntimeError": FAMILIES["RuntimeError"],
}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def lease_paths(request, tmp_path):
    """(path through the faulty store, the same path on the real store) for one step's output."""
    if request.param == "local":
        FaultyFileSystem.target_protocol = "file"
        real = str(tmp_path / "step")
        faulty = f"faulty://{real}"
    else:
        bucket = request.getfixturevalue("s3_server").removeprefix("s3://")
        FaultyFileSystem.target_protocol = "s3"
        key = f"{bucket}/{uuid.uuid4().hex[:10]}/step"
        real, faulty = f"s3://{key}", f"faulty://{key}"
    FaultyFileSystem.arm(None)
    yield faulty, real
    FaultyFileSystem.arm(None)


def heartbeat_time(real_path: str) -> str:
    record = Lease(real_path, "observer", LeaseSettings()).current()
    assert record is not None
    return record["heartbeat"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_heartbeat_survives_renewal_failures_of_every_family(lease_paths, family):
    faulty, real = lease_paths
    lease = Lease(faulty, "holder", LeaseSettings(heartbeat_s=0.05, stale_s=60.0))
    assert lease.try_acquire()
    lost: list[LeaseLostError] = []
    with Heartbeat(lease, on_lost=lost.append):
        FaultyFileSystem.arm(FAMILIES[family])
        wait_until(lambda: FaultyFileSystem.failures >= 3, "three failed renewals", timeout_s=30)
        FaultyFileSystem.arm(None)
        before = heartbeat_time(real)
        wait_until(lambda: heartbeat_time(real) != before, "renewals to resume", timeout_s=30)
    assert lost == []
    lease.release()


def test_the_heartbeat_survives_a_failing_tick(lease_paths):
    faulty, real = lease_paths
    lease = Lease(faulty, "holder", LeaseSettings(heartbeat_s=0.05, stale_s=60.0))
    assert lease.try_acquire()
    ticks: list[int] = []

    def failing_upload() -> None:
        ticks.append(1)
        raise HttpError({"code": 401, "message": "log upload refused"})

    with Heartbeat(lease, on_lost=lambda error: pytest.fail(f"lost: {error}"), on_tick=failing_upload):
        wait_until(lambda: len(ticks) >= 3, "three ticks", timeout_s=30)
        before = heartbeat_time(real)
        wait_until(lambda: heartbeat_time(real) != before, "renewals to go on", timeout_s=30)
    lease.release()


@pytest.mark.parametrize("family", LASTING)
def test_a_holder_that_cannot_renew_stops_before_its_lease_can_be_taken_over(lease_paths, family):
    faulty, real = lease_paths
    settings = LeaseSettings(heartbeat_s=0.05, stale_s=2.0)
    holder = Lease(faulty, "holder", settings)
    assert holder.try_acquire()
    order: list[str] = []
    lost: list[LeaseLostError] = []

    def on_lost(error: LeaseLostError) -> None:
        lost.append(error)
        order.append("holder stopped")

    competitor = Lease(real, "competitor", settings)
    with Heartbeat(holder, on_lost=on_lost):
        FaultyFileSystem.arm(LASTING[family])
        while not competitor.try_acquire():  # ends when the holder's lease goes stale
            time.sleep(0.02)
        order.append("competitor took over")
        wait_until(lambda: lost, "the holder to stop", timeout_s=60)
    assert order == ["holder stopped", "competitor took over"]
    assert "renew" in str(lost[0])
    FaultyFileSystem.arm(None)
    holder.release()  # refuses quietly: the lease is the competitor's now
    assert Lease(real, "observer", settings).current()["worker"] == "competitor"


def test_a_status_write_from_an_older_lease_is_refused(tmp_path):
    output = str(tmp_path / "step")
    settings = LeaseSettings(heartbeat_s=0.05, stale_s=1.0)
    old = Lease(output, "old", settings)
    assert old.try_acquire()
    append_event(output, StatusEvent(StepStatus.RUNNING, attempt=1, worker="old", lease=old.number))
    plant_crashed_holder(output, worker="old")  # its heartbeat is now long ago: anyone may take over
    new = Lease(output, "new", settings)
    assert new.try_acquire() and new.number == 1
    append_event(output, StatusEvent(StepStatus.RUNNING, attempt=2, worker="new", lease=new.number))
    before = read_events(output)
    with pytest.raises(LeaseLostError, match="lease 0"):
        append_event(output, StatusEvent(StepStatus.SUCCESS, attempt=1, worker="old", lease=0))
    assert read_events(output) == before
    append_event(output, StatusEvent(StepStatus.SUCCESS, attempt=2, worker="new", lease=new.number))
    assert read_status(output) == "SUCCESS"


def fail_when_gate_opens(config: WriteConfig) -> None:
    while not os.path.exists(config.text):
        time.sleep(0.02)
    raise RuntimeError(f"{config.name} was told to fail")


def failing_parent_and_child(tmp_path: Path) -> tuple[Path, ExecutorStep, ExecutorStep]:
    gate = tmp_path / "gate"
    parent = ExecutorStep("parent", fail_when_gate_opens, WriteConfig("parent", THIS_OUTPUT_PATH, text=str(gate)))
    return gate, parent, make_step("child", parent)


@pytest.mark.parametrize("elsewhere", ["SUCCESS", "RUNNING"])
def test_dep_failed_never_buries_a_success_or_a_live_run(tmp_path, fast_leases, elsewhere):
    gate, parent, child = failing_parent_and_child(tmp_path)
    executor = Executor(str(tmp_path / "out"))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            executor.run([child])
        except StepFailedError as error:
            errors.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    wait_until(lambda: executor.output_paths.get(parent) and read_status(executor.output_paths[parent]) == "RUNNING",
               "the parent to run")  # fmt: skip
    child_output = executor.output_paths[child]
    # Another executor (which saw the parent's earlier output) runs the child meanwhile.
    other = Lease(child_output, "other-executor", LeaseSettings.from_env())
    assert other.try_acquire()
    append_event(child_output, StatusEvent(StepStatus.RUNNING, attempt=1, worker="other-executor", lease=0))
    with Heartbeat(other, on_lost=lambda error: pytest.fail(f"lost: {error}")):
        if elsewhere == "SUCCESS":
            append_event(child_output, StatusEvent(StepStatus.SUCCESS, attempt=1, worker="other-executor", lease=0))
            other.release()
        gate.write_text("")
        runner.join()
    other.release()
    assert len(errors) == 1 and errors[0].dep_failed == [executor.plan.lookup(child).label]
    assert read_status(child_output) == elsewhere


def test_a_dry_run_says_take_over_for_a_stale_running_step(tmp_path, fast_leases, capsys):
    stale, live = make_step("stale"), make_step("live")
    probe = Executor(str(tmp_path))
    probe.run([stale, live], dry_run=True)
    plant_crashed_holder(probe.output_paths[stale])
    holder = Lease(probe.output_paths[live], "live-worker", LeaseSettings.from_env())
    assert holder.try_acquire()
    append_event(probe.output_paths[live], StatusEvent(StepStatus.RUNNING, attempt=1, worker="live-worker"))
    with Heartbeat(holder, on_lost=lambda error: pytest.fail(f"lost: {error}")):
        dry = Executor(str(tmp_path))
        dry.run([stale, live], dry_run=True)
        actions = {decision.planned.name: decision.action for decision in dry.decisions}
    holder.release()
    assert actions == {"stale": "take over", "live": "wait"}
    assert "take over" in capsys.readouterr().out


def test_a_live_holder_on_another_host_or_in_a_live_process_is_waited_for(tmp_path):
    output = str(tmp_path / "step")
    settings = LeaseSettings(heartbeat_s=1.0, stale_s=3600.0)
    for host, pid in (("another-host", 2**22 + 1), (None, os.getpid())):
        storage.delete(storage.join(output, ".executor_lease"), recursive=True)
        holder = Lease(output, "holder", settings)
        assert holder.try_acquire()
        if host is not None:  # the same record, as a process on another machine would have written it
            record = {**holder.current(), "host": host, "pid": pid}
            storage.write_json_atomic(storage.join(output, ".executor_lease", "0000000000.json"), record)
        assert not Lease(output, "waiter", settings).try_acquire()


@pytest.mark.slow
def test_a_killed_local_run_is_taken_over_at_once(tmp_path):
    """SIGKILL a run mid-step; the rerun on this machine takes its lease over without waiting for staleness."""
    prefix, gate = tmp_path / "out", tmp_path / "gate"
    step = gate_step(str(gate), str(prefix) + "-records")
    planner = Executor(str(prefix))
    planner.run([step], dry_run=True)
    output = planner.output_paths[step]
    # An hour-long stale interval: a rerun that waited for staleness would never get to SUCCESS here.
    env = {**os.environ, "EXECUTOR_LEASE_HEARTBEAT_S": "5", "EXECUTOR_LEASE_STALE_S": "3600"}
    with open(tmp_path / "run.log", "wb") as log:
        killed = subprocess.Popen([sys.executable, RUNNER, str(prefix), str(gate)], stdout=log,
                                  stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            wait_until(lambda: read_status(output) == "RUNNING", "the first run's step")
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait()
        gate.write_text("")
        rerun = subprocess.Popen([sys.executable, RUNNER, str(prefix), str(gate)], stdout=log,
                                 stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            wait_until(lambda: read_status(output) == "SUCCESS", "the rerun to take over and finish")
            assert rerun.wait(timeout=120) == 0
        finally:
            rerun.kill()
    history = [(event.status, event.attempt) for event in read_events(output)]
    assert history == [("WAITING", 0), ("RUNNING", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert storage.list_names(storage.join(output, ".executor_lease")) == ["0000000001.json"]
    assert f":{killed.pid}:" in read_events(output)[1].worker
    assert "holder process" in (tmp_path / "run.log").read_text()
