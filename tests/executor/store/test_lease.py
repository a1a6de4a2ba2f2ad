"""Exactly-once across executors: leases, waiting, stale takeover, lost leases."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CALLS, make_step, plant_crashed_holder, race, run_in_threads, wait_until

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, read_status, storage
from executor.run.step_task import Outcome
from executor.store.events import StatusEvent, StepStatus, append_event, now_iso, read_events
from executor.store.lease import Heartbeat, Lease, LeaseSettings


@dataclass(frozen=True)
class GateConfig:
    name: str
    output_path: str


GATES: dict[str, threading.Event] = {}
INTERRUPTED: list[str] = []


def gated(config: GateConfig) -> None:
    """Runs until the test opens its gate; records being interrupted."""
    CALLS.record(config.name)
    try:
        while not GATES[config.name].wait(0.01):
            pass
    except BaseException as error:
        INTERRUPTED.append(type(error).__name__)
        raise
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    Path(config.output_path, "out.txt").write_text(config.name)


def gated_step(name: str) -> ExecutorStep:
    GATES[name] = threading.Event()
    return ExecutorStep(name, gated, GateConfig(name, THIS_OUTPUT_PATH))


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_exclusive_create_has_exactly_one_winner(tmp_path, kind):
    path = str(tmp_path / "lease.json") if kind == "local" else "memory://race-test/lease.json"
    wins = race(20, lambda index: storage.create_exclusive(path, f"{index}"))
    assert len(wins) == 1
    assert storage.read_text(path) == str(wins[0])
    storage.delete(path)


def test_ten_executors_on_one_dag_run_each_step_once(tmp_path, calls, fast_leases):
    a = make_step("a")
    b1, b2, b3 = (make_step(f"b{i}", a) for i in range(3))
    c = make_step("c", b1, b2, b3)
    d = make_step("d", c)
    e = make_step("e")  # an independent branch
    errors = run_in_threads(10, lambda: Executor(str(tmp_path)).run([d, e], max_concurrent=3))
    assert errors == []
    assert calls.counts == {"a": 1, "b0": 1, "b1": 1, "b2": 1, "c": 1, "d": 1, "e": 1}
    planned = Executor(str(tmp_path))
    planned.run([d, e], dry_run=True)
    for step in (a, b1, b2, b3, c, d, e):
        statuses = [event.status for event in read_events(planned.output_paths[step])]
        assert statuses.count("RUNNING") == 1 and statuses[-1] == "SUCCESS"


def test_a_waiting_executor_picks_up_another_executors_result(tmp_path, calls, fast_leases, caplog):
    step = gated_step("slow")
    first, second = Executor(str(tmp_path)), Executor(str(tmp_path))
    runner = threading.Thread(target=first.run, args=([step],))
    runner.start()
    wait_until(lambda: first.output_paths.get(step) and read_status(first.output_paths[step]) == "RUNNING", "RUNNING")
    with caplog.at_level(logging.INFO):
        waiter = threading.Thread(target=second.run, args=([step],))
        waiter.start()
        wait_until(lambda: "holds the lease" in caplog.text, "the second executor to wait")
    GATES["slow"].set()
    runner.join()
    waiter.join()
    assert calls.counts == {"slow": 1}
    planned = second.plan.lookup(step)
    assert second.results[planned].outcome == Outcome.DONE_ELSEWHERE
    assert first.results[first.plan.lookup(step)].outcome == Outcome.SUCCEEDED


def test_a_stale_lease_is_taken_over(tmp_path, calls, fast_leases, caplog):
    step = make_step("orphan")
    probe = Executor(str(tmp_path))
    probe.run([step], dry_run=True)
    output = probe.output_paths[step]
    plant_crashed_holder(output)
    with caplog.at_level(logging.WARNING):
        executor = Executor(str(tmp_path))
        executor.run([step])
    assert "taking over the lease of crashed-worker: stale" in caplog.text
    assert calls.counts == {"orphan": 1}
    history = read_events(output)
    assert [(e.status, e.attempt) for e in history] == [("RUNNING", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert history[-1].worker.startswith(executor.worker_id + "/")
    assert storage.list_names(f"{output}/.executor_lease") == ["0000000001.json"]


@pytest.mark.slow
def test_a_fresh_lease_is_never_taken_over(tmp_path, calls, fast_leases):
    step = make_step("held")
    probe = Executor(str(tmp_path))
    probe.run([step], dry_run=True)
    output = probe.output_paths[step]
    settings = LeaseSettings.from_env()
    other = Lease(output, "other-worker", settings)
    assert other.try_acquire()
    waiter = Executor(str(tmp_path))
    with Heartbeat(other, on_lost=lambda error: pytest.fail(f"the holder lost its lease: {error}")):
        thread = threading.Thread(target=waiter.run, args=([step],))
        thread.start()
        # Several stale intervals pass while the holder keeps heartbeating: the waiter must not run.
        for _ in range(int(3 * settings.stale_s / settings.heartbeat_s)):
            time.sleep(settings.heartbeat_s)
            assert calls.counts == {}
            assert other.current()["worker"] == "other-worker"
        append_event(output, StatusEvent(StepStatus.SUCCESS, worker="other-worker"))
    other.release()
    thread.join()
    assert calls.counts == {}
    assert waiter.results[waiter.plan.lookup(step)].outcome == Outcome.DONE_ELSEWHERE


def test_losing_the_lease_aborts_the_step_and_the_loser_waits_for_the_new_holder(tmp_path, calls, fast_leases):
    INTERRUPTED.clear()
    step = gated_step("victim")
    executor = Executor(str(tmp_path))
    runner = threading.Thread(target=executor.run, args=([step],))
    runner.start()
    wait_until(
        lambda: executor.output_paths.get(step) and read_status(executor.output_paths[step]) == "RUNNING", "RUNNING"
    )
    output = executor.output_paths[step]
    # Another worker decides the lease is stale and takes it (exclusive create of the next number).
    usurper = Lease(output, "usurper", LeaseSettings.from_env())
    storage.create_exclusive(
        f"{output}/.executor_lease/0000000001.json",
        json.dumps({"worker": "usurper", "number": 1, "acquired": now_iso(), "heartbeat": now_iso()}),
    )
    usurper.number = 1
    wait_until(lambda: INTERRUPTED, "the step to be interrupted")
    assert INTERRUPTED == ["StepAborted"]
    assert runner.is_alive()  # the loser now waits for the usurper's result
    append_event(output, StatusEvent(StepStatus.SUCCESS, worker="usurper"))
    usurper.release()
    runner.join()
    statuses = [(e.status, e.worker) for e in read_events(output)]
    assert statuses[-1] == ("SUCCESS", "usurper")
    assert [worker for status, worker in statuses if status == "SUCCESS"] == ["usurper"]
    assert executor.results[executor.plan.lookup(step)].outcome == Outcome.DONE_ELSEWHERE
    assert not Path(output, "out.txt").exists()
