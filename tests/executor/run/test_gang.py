"""Multi-host steps as Ray gangs, on one machine: two stand-in hosts x 2 fake CPU devices, gloo collectives.

The pure parts (bundles, placement, resources from a hardware profile) are checked without Ray; the gang's watch
(a member that answers its heartbeat but advances no step, one that is stopped, one whose step raises) on counted-sum
gangs, which need no model. Training as a gang against one process, and a killed coordinator's retry resuming from
its checkpoint, are tests/executor/run/test_gang_training.py's: a file of its own, so the two run side by side.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gang_steps import CountedSumConfig, GlobalSumConfig, counted_sum, global_sum
from paths import REPO, SUPPORT

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, ResourceConfig, progress, storage
from executor.dag.plan import build_plan
from executor.errors import ConfigError, StepFailedError
from executor.run.backends import check_gang_storage
from executor.run.collector import YOUNG_THRESHOLD
from executor.run.cpu_devices import stand_in_environment, with_stand_in_flags
from executor.run.gang import POLL_S, GangRecord, MemberRecord, bundle_specs, member_options, placement_strategy
from executor.run.gang_member import GangMember, host_log_file
from executor.store.events import StatusEvent, StepStatus, append_event, read_events
from executor.store.layout import GANG_FILE
from executor.store.processes import is_running
from executor.store.step_log import StepLog
from executor.watch.step_view import live_state
from experiments import hero_535b
from steps.train.hardware import HARDWARE, host_resources

HANG_TIMEOUT_S = 20.0
"""Twenty missed heartbeats (the driver pings every second): a member answers from a thread of its own while it
compiles or trains, so on a busy 2-core machine only a stopped process stays silent that long."""
STAND_IN = ResourceConfig(hosts=2, cpu_devices_per_host=2, cpus=0.5, hang_timeout_s=HANG_TIMEOUT_S,
                          progress_timeout_s=300.0)  # fmt: skip
"""Steps may take longer than a heartbeat's timeout on a loaded machine (the end-of-run eval and save): the
stall tests below set their own progress timeout."""


def test_gang_bundles_for_gpu_nodes_and_tpu_slices_come_from_the_hardware_profile():
    gb200 = host_resources(HARDWARE["gb200"], hosts=11)
    assert gb200.hosts == 11 and gb200.cpu_devices_per_host is None
    assert bundle_specs(gb200) == [{"GPU": 4, "accelerator_type:GB200": 0.001}] * 11
    tpu = host_resources(HARDWARE["tpu_v5p"], hosts=16)
    assert bundle_specs(tpu) == [{"TPU": 4, "accelerator_type:TPU-V5P": 0.001}] * 16
    assert placement_strategy(gb200) == placement_strategy(tpu) == "STRICT_SPREAD"  # one host per node


def test_gang_stand_in_hosts_are_packed_onto_one_machine_with_fake_devices():
    assert placement_strategy(STAND_IN) == "PACK"
    assert bundle_specs(STAND_IN) == [{"CPU": 0.5}, {"CPU": 0.5}]
    assert stand_in_environment(2) == {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=1",
        "JAX_PLATFORMS": "cpu",
    }
    assert with_stand_in_flags("--xla_backend_optimization_level=2 --a=b") == "--xla_backend_optimization_level=2 --a=b"
    assert stand_in_environment(None) == {}
    assert host_log_file(1) == "logs/host-1.log"


def test_gang_member_options_take_their_own_bundle():
    pytest.importorskip("ray")
    tpu = host_resources(HARDWARE["tpu_v5p"], hosts=2)
    options = member_options(tpu, groups=[None], rank=1)
    assert options["num_cpus"] == 0 and options["resources"] == {"TPU": 4, "accelerator_type:TPU-V5P": 0.001}
    assert options["scheduling_strategy"].placement_group_bundle_index == 1
    assert options["max_restarts"] == 0


def test_gang_stand_in_hosts_keep_the_tiny_hero_dags_hashes():
    tiny = hero_535b.tiny_scale()
    gangs = hero_535b.with_stand_in_hosts(tiny, hosts=2)
    plain, ganged = (hero_535b.build_dag(scale) for scale in (tiny, gangs))
    assert {step.resources.hosts for _rung, step in (*ganged.trains.values(), *ganged.evaluates.values())} == {2}
    hashes = [{step.name: step.hash for step in build_plan(dag.steps, "/prefix").steps} for dag in (plain, ganged)]
    assert hashes[0] == hashes[1]  # resources are never hashed


@pytest.mark.parametrize("bad", [{"hosts": 0}, {"cpu_devices_per_host": 0}, {"hang_timeout_s": 0}])
def test_gang_resources_refuse_nonsense(bad):
    with pytest.raises(ConfigError):
        ResourceConfig(**bad)


def test_gang_of_real_hosts_on_a_local_prefix_is_refused_before_any_host_starts(tmp_path):
    """Each real host would write its checkpoint shards to its own disk: refused, naming the step and the prefix,
    before a lease, a status or the experiment record is written; stand-in hosts (one machine) and a prefix
    vouched for as shared (`shared_filesystem`) are not refused."""
    step = ExecutorStep(name="train/racks", fn=global_sum, config=GlobalSumConfig(output_path=THIS_OUTPUT_PATH),
                        resources=host_resources(HARDWARE["gb200"], hosts=16))  # fmt: skip
    prefix = tmp_path / "runs"
    with pytest.raises(ConfigError) as refused:
        Executor(prefix=str(prefix)).run([step])
    message = str(refused.value)
    assert "train/racks" in message and str(prefix) in message and "16 hosts" in message
    assert "gs://" in message and "--shared_filesystem true" in message
    assert not prefix.exists() or not any(path.is_file() for path in prefix.rglob("*")), list(prefix.rglob("*"))
    label, output_path = "train/racks-0123abcd", str(prefix / "train" / "racks-0123abcd")
    check_gang_storage([(label, output_path, step.resources)], shared_filesystem=True)
    check_gang_storage([(label, output_path, STAND_IN)], shared_filesystem=False)
    check_gang_storage([(label, "gs://bucket/train/racks-0123abcd", step.resources)], shared_filesystem=False)


def test_gang_is_shown_live_on_the_step_page(tmp_path):
    output_path = str(tmp_path / "train" / "run-abc")
    append_event(output_path, StatusEvent(StepStatus.RUNNING, attempt=1, worker="w"))
    record = GangRecord(hosts=2, placement="PACK", state="failed", coordinator="10.0.0.1:1234")
    record.members = [MemberRecord(0, "running", pid=11, ip="10.0.0.1"), MemberRecord(1, "hung", pid=12)]
    storage.write_json_atomic(f"{output_path}/{GANG_FILE}", dataclasses.asdict(record))
    gang = live_state(output_path)["gang"]
    assert gang["hosts"] == 2 and [member["state"] for member in gang["members"]] == ["running", "hung"]
    assert live_state(str(tmp_path / "single-host"))["gang"] is None


def test_gang_member_log_is_put_back_after_the_trainer_clears_the_root_logger(tmp_path):
    member = GangMember(rank=1, hosts=2, output_path=str(tmp_path), stand_in=True)
    root = logging.getLogger()
    saved = list(root.handlers)
    with StepLog(str(tmp_path), host_log_file(1), all_threads=True) as log:
        member._log = log
        root.handlers.clear()  # what Levanter's logging setup does when its trainer starts
        logging.getLogger("levanter.x").warning("lost: before the heartbeat")
        member.ping()
        logging.getLogger("levanter.x").warning("kept: after the heartbeat")
    root.handlers[:] = saved
    text = (tmp_path / host_log_file(1)).read_text()
    assert "kept: after the heartbeat" in text and "lost" not in text


@pytest.mark.ray
def test_gang_on_the_ray_backend_sees_the_global_devices(tmp_path, local_ray):
    """The Ray backend's path: the gang's driver runs in this process, its two members in Ray. Beside it, in the
    same run, one-host steps (a gang's reference) get their own fake devices, each count in a worker of its own."""
    step = ExecutorStep(name="gang/sum", fn=global_sum, config=GlobalSumConfig(THIS_OUTPUT_PATH), resources=STAND_IN)
    one_host = [ExecutorStep(name=f"one-host/sum-{count}", fn=global_sum, config=GlobalSumConfig(THIS_OUTPUT_PATH),
                             resources=ResourceConfig(cpu_devices_per_host=count)) for count in (2, 3)]  # fmt: skip
    executor = Executor(str(tmp_path), backend="ray")
    executor.run([step, *one_host])
    output_path = Path(executor.output_paths[step])
    # Process 0 holds 0 and 1, process 1 holds 10 and 11, on 4 global devices.
    assert json.loads((output_path / "seen.json").read_text()) == {"sum": 22.0, "devices": 4, "processes": 2,
                                                                 "gc_young": YOUNG_THRESHOLD}
    statuses = [event.status for event in read_events(str(output_path)) if event.attempt]
    assert statuses == [StepStatus.RUNNING, StepStatus.SUCCESS]
    gang = json.loads((output_path / GANG_FILE).read_text())
    assert all(isinstance(member["started"], int) for member in gang["members"]), gang["members"]
    assert not [member["pid"] for member in gang["members"] if is_running(member["pid"], member["started"])]
    seen = [json.loads((Path(executor.output_paths[step]) / "seen.json").read_text()) for step in one_host]
    # Each step ran with the garbage collector a step gets, in a Ray worker (a gang member above) that Python started at
    # its default of 700 (executor/run/collector.py).
    assert seen == [{"sum": 1.0, "devices": 2, "processes": 1, "gc_young": YOUNG_THRESHOLD},
                    {"sum": 3.0, "devices": 3, "processes": 1, "gc_young": YOUNG_THRESHOLD}]  # fmt: skip


LOCAL_BACKEND_RUN = """
import gc, sys
from gang_steps import CountedSumConfig, GlobalSumConfig, counted_sum, global_sum
from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, ResourceConfig
executor = Executor(sys.argv[1], backend="local")
for name, count in (("two", 2), ("three", 3)):
    step = ExecutorStep(name=f"one-host/sum-{name}", fn=global_sum, config=GlobalSumConfig(THIS_OUTPUT_PATH),
                        resources=ResourceConfig(cpu_devices_per_host=count))
    try:
        executor.run([step])
    except Exception as error:
        print("FAILED", executor.output_paths[step], type(error).__name__)
print("GC", gc.get_threshold())
"""


@pytest.mark.slow
def test_multi_host_reference_one_host_step_gets_its_fake_devices_on_the_local_backend(tmp_path):
    """The local backend runs steps in its own process, whose JAX takes the first step's devices; a later step
    asking for another count is refused, naming itself and the way out, never run on the wrong devices. The step
    ran with the garbage collector a step gets, and the process has its own thresholds back after the run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(SUPPORT)])}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", LOCAL_BACKEND_RUN, str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(next(tmp_path.glob("one-host/sum-two-*/seen.json")).read_text())
    assert seen == {"sum": 1.0, "devices": 2, "processes": 1, "gc_young": YOUNG_THRESHOLD}
    refused = next(tmp_path.glob("one-host/sum-three-*"))
    assert f"FAILED {refused} " in done.stdout, done.stdout
    assert "GC (700, 10, 10)" in done.stdout, done.stdout  # Python's default, as the process started
    failure = [event for event in read_events(str(refused)) if event.status == StepStatus.FAILED][-1]
    assert "asks for 3 fake CPU devices" in (failure.message or "") and "--backend ray" in (failure.message or "")
    assert not (refused / "seen.json").exists()


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from executor.run.backends import ensure_ray

    if ray.is_initialized():
        ray.shutdown()
    ensure_ray()
    yield ray
    ray.shutdown()


def test_stalled_watch_allows_the_first_step_and_checkpoints_their_own_time_and_skips_silent_steps():
    """The driver's rule (executor/run/gang_progress.py), on its own clock: hung once no member advanced within the
    allowance while one is in a phase; outside any phase (a step function that never enters one, or the train
    step's export after its loop) the heartbeat alone watches."""
    watch = progress.ProgressWatch(hang_timeout_s=10, first_step_timeout_s=100, checkpoint_timeout_s=50, now=0)
    watch.heard(0, {"step": None, "phase": None}, now=5)
    assert watch.stalled(now=10_000) is None  # no phase: heartbeat only
    watch.heard(0, {"step": None, "phase": "training"}, now=6)
    assert watch.stalled(now=99) is None and "its first step" in watch.stalled(now=101)
    watch.heard(1, {"step": 0, "phase": "training"}, now=101)
    watch.heard(0, {"step": 0, "phase": "training"}, now=105)  # each member's own step counts
    assert watch.stalled(now=114) is None and "a step" in watch.stalled(now=116)
    watch.heard(0, {"step": 0, "phase": "training"}, now=116)  # the same step again: no advance
    assert watch.stalled(now=116) is not None
    watch.heard(1, {"step": 1, "phase": progress.CHECKPOINT}, now=117)  # saving after step 1
    assert watch.stalled(now=166) is None and watch.stalled(now=168) is not None
    watch.heard(1, {"step": 1, "phase": "training"}, now=150)  # the save ended: back to the step allowance
    assert watch.stalled(now=150) is not None
    for rank in (0, 1):  # the loop ended (an export follows): no longer watched for steps
        watch.heard(rank, {"step": 7, "phase": None}, now=151)
    assert watch.stalled(now=10_000) is None


def test_stalled_watch_gives_an_eval_its_own_allowance_from_its_start():
    """An eval completes no step (and the first compiles its program): `progress.EVAL` has `eval_timeout_s` from
    when the driver first saw it, as a checkpoint save has its own; training around it keeps the step allowance,
    and a watch given no eval allowance holds an eval to the step's."""
    watch = progress.ProgressWatch(hang_timeout_s=10, first_step_timeout_s=100, checkpoint_timeout_s=50, now=0,
                                   eval_timeout_s=300)  # fmt: skip
    watch.heard(0, {"step": 4, "phase": "training"}, now=20)
    watch.heard(0, {"step": 4, "phase": progress.EVAL}, now=25)
    assert watch.stalled(now=324) is None and "a step" in watch.stalled(now=326)
    watch.heard(0, {"step": 5, "phase": "training"}, now=200)  # the eval ended, a step completed
    assert watch.stalled(now=209) is None and watch.stalled(now=211) is not None
    plain = progress.ProgressWatch(hang_timeout_s=10, first_step_timeout_s=100, checkpoint_timeout_s=50, now=0)
    plain.heard(0, {"step": 4, "phase": "training"}, now=20)
    plain.heard(0, {"step": 4, "phase": progress.EVAL}, now=25)
    assert plain.stalled(now=31) is not None


def counted_step(prefix: Path, name: str, progress_timeout_s: float | None = None,
                 **settings) -> tuple[Executor, ExecutorStep]:  # fmt: skip
    config = CountedSumConfig(output_path=THIS_OUTPUT_PATH, **settings)
    resources = dataclasses.replace(STAND_IN, hang_timeout_s=15.0, progress_timeout_s=progress_timeout_s)
    return Executor(str(prefix), backend="ray"), ExecutorStep(name=name, fn=counted_sum, config=config,
                                                              resources=resources)  # fmt: skip


def run_retried_once(executor: Executor, step: ExecutorStep) -> tuple[Path, str]:
    """Run a counted-sum gang step of 8 iterations that must fail once as transient and then finish with the
    uninterrupted total: its output path and the failed attempt's message."""
    executor.run([step])
    output_path = Path(executor.output_paths[step])
    assert json.loads((output_path / "result.json").read_text()) == {"done": 8, "total": counted_total(8)}
    events = [event for event in read_events(str(output_path)) if event.attempt]
    assert [event.status for event in events] == [StepStatus.RUNNING, StepStatus.WAITING, StepStatus.RUNNING,
                                                  StepStatus.SUCCESS]  # fmt: skip
    return output_path, events[1].message or ""


def counted_total(iterations: int) -> float:
    """The sum over `iterations` of 4 devices holding 0, 1 (process 0) and 10, 11 (process 1), each plus the
    iteration."""
    return sum(22.0 + 4 * iteration for iteration in range(iterations))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stalled_gang_member_that_answers_its_heartbeat_is_torn_down_and_the_retry_resumes(tmp_path, local_ray):
    """Member 1 sleeps 300 s inside iteration 3 while member 0 waits for it in the collective, both answering
    their heartbeat: the driver finds no member advanced for hang_timeout_s (15 s), tears the gang down, and the
    retried gang resumes from iteration 3 to the uninterrupted total. Before, the gang waited out the sleep."""
    executor, step = counted_step(tmp_path, "gang/stalled", stall_at=3, stall_s=300.0)
    started = time.monotonic()
    output_path, message = run_retried_once(executor, step)
    assert "GangMemberLostError" in message and "is hung: no member completed a step" in message, message
    assert time.monotonic() - started < 300  # the sleep was cut short by the teardown, not waited out
    gang = json.loads((output_path / GANG_FILE).read_text())
    assert [member["progress_step"] for member in gang["members"]] == [7, 7]
    assert not [member["pid"] for member in gang["members"] if is_running(member["pid"], member["started"])]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stalled_watch_never_tears_down_a_slow_gang_that_advances(tmp_path, local_ray):
    """Six seconds an iteration, 24 s in all, against a hang timeout of 15 s: one attempt, SUCCESS. The driver
    heard each member's heartbeat about once a second all along, never faster (it re-pinged a member as soon as
    it answered: thousands of heartbeats, a driver thread and every member kept busy)."""
    executor, step = counted_step(tmp_path, "gang/slow", iterations=4, pace_s=6.0)
    started = time.monotonic()
    executor.run([step])
    took_s = time.monotonic() - started
    output_path = Path(executor.output_paths[step])
    heartbeats = [member["heartbeats"] for member in json.loads((output_path / GANG_FILE).read_text())["members"]]
    assert all(5 <= count <= took_s / POLL_S + 1 for count in heartbeats), (heartbeats, took_s)
    assert json.loads((output_path / "result.json").read_text()) == {"done": 4, "total": counted_total(4)}
    statuses = [event.status for event in read_events(str(output_path)) if event.attempt]
    assert statuses == [StepStatus.RUNNING, StepStatus.SUCCESS]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gang_member_stopped_is_found_hung_and_the_retry_resumes(tmp_path, local_ray):
    """Member 1 stops itself (SIGSTOP) inside iteration 3, so its heartbeat goes silent too: the driver finds it
    hung after hang_timeout_s (15 s; the step-progress allowance is set far longer, so only the heartbeat rule
    can fire), tears the gang down (the stopped process killed with the rest) and the retried gang resumes from
    the checkpointed iteration to the uninterrupted total."""
    executor, step = counted_step(tmp_path, "gang/stopped", progress_timeout_s=600.0, stop_at=3)
    output_path, message = run_retried_once(executor, step)
    assert "GangMemberLostError" in message and "gang member 1 of 2" in message and ") hung:" in message, message
    assert "answered no heartbeat" in message, message
    gang = json.loads((output_path / GANG_FILE).read_text())
    assert not [member["pid"] for member in gang["members"] if is_running(member["pid"], member["started"])]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gang_member_whose_step_raises_fails_the_step_once_naming_the_member_and_leaves_no_process(tmp_path, local_ray):
    """Member 1's step raises ValueError inside iteration 2 (a bug in the step, not a lost host): the step is
    FAILED after one attempt (not retried as a lost member would be), its message names the member, the gang and
    the error, the traceback is the member's, and no member process is left behind."""
    executor, step = counted_step(tmp_path, "gang/raises", raise_at=2)
    with pytest.raises(StepFailedError):
        executor.run([step])
    output_path = Path(executor.output_paths[step])
    events = [event for event in read_events(str(output_path)) if event.attempt]
    assert [event.status for event in events] == [StepStatus.RUNNING, StepStatus.FAILED]
    failed = events[-1]
    assert "ValueError: counted sum refuses iteration 2" in (failed.message or ""), failed.message
    assert "raised in gang member 1 of 2" in (failed.message or ""), failed.message
    assert "counted sum refuses iteration 2" in failed.details["traceback"]
    assert not (output_path / "result.json").exists()
    gang = json.loads((output_path / GANG_FILE).read_text())
    assert gang["state"] == "failed"
    assert not [member["pid"] for member in gang["members"] if is_running(member["pid"], member["started"])]
