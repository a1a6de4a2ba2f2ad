"""The same DAGs on the local and the Ray backend: same hashes, same outputs, same failures."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import sharded_steps
from conftest import make_step, wait_until

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, ResourceConfig, StepFailedError, read_status, versioned
from executor.shards.writer import read_shard_markers
from executor.store.events import read_events

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    import ray

    from executor.run.backends import ensure_ray

    if ray.is_initialized():
        ray.shutdown()
    ensure_ray()
    yield ray
    ray.shutdown()


def test_a_sharded_dag_gives_identical_outputs_on_both_backends(tmp_path, local_ray):
    outputs = {}
    for backend in ("local", "ray"):
        steps = sharded_steps.build_dag(shards=6, parallelism="auto", rounds=500)
        executor = Executor(str(tmp_path / backend), backend=backend)
        executor.run(steps)
        outputs[backend] = {
            step.name: (executor.output_paths[step].rsplit("/", 1)[1],
                        sharded_steps.manifest_digests(executor.output_paths[step]))
            for step in steps
        }  # fmt: skip
        for step in steps:
            assert read_status(executor.output_paths[step]) == "SUCCESS"
        markers = read_shard_markers(executor.output_paths[steps[0]])
        assert sorted(markers) == [f"{i:04d}" for i in range(6)]
    assert outputs["local"] == outputs["ray"]


def test_failures_and_dependents_on_ray(tmp_path, local_ray, calls):
    bad = make_step("bad", fail=True)
    child = make_step("child", bad)
    good = make_step("good", text="G")
    executor = Executor(str(tmp_path), backend="ray")
    with pytest.raises(StepFailedError, match=r"^1 step\(s\) failed: bad-.*bad was told to fail"):
        executor.run([child, good])
    assert read_status(executor.output_paths[good]) == "SUCCESS"
    assert read_status(executor.output_paths[child]) == "DEP_FAILED"
    failed = read_events(executor.output_paths[bad])[-1]
    assert failed.status == "FAILED" and "RuntimeError" in failed.details["traceback"]
    assert "/" in failed.worker and failed.worker.startswith(executor.worker_id)


def test_a_step_can_ask_for_ray_resources(tmp_path, local_ray):
    from executor import ResourceConfig
    from executor.run.backends import ray_options

    options = ray_options(ResourceConfig(cpus=2, memory_gb=1.5, gpus=1, accelerator_type="H100", custom={"x": 1}), 3)
    assert options == {
        "num_cpus": 2, "num_gpus": 1, "max_retries": 2, "retry_exceptions": False,
        "memory": int(1.5 * 2**30), "accelerator_type": "H100", "resources": {"x": 1},
    }  # fmt: skip
    assert ray_options(ResourceConfig(gpus=8), 3)["num_cpus"] == 0  # accelerator nodes declare no CPUs
    assert ray_options(None, 1) == {"num_cpus": 1, "num_gpus": 0, "max_retries": 0, "retry_exceptions": False}
    step = make_step("small")
    step = type(step)(step.name, step.fn, step.config, resources=ResourceConfig(cpus=0.5))
    executor = Executor(str(tmp_path), backend="ray")
    executor.run([step])
    assert read_status(executor.output_paths[step]) == "SUCCESS"


@dataclass(frozen=True)
class BarrierConfig:
    output_path: str
    barrier: str
    parties: int
    index: int


def meet_at_barrier(config: BarrierConfig) -> None:
    """Finish only once `parties` steps are running at the same time."""
    Path(config.barrier, str(config.index)).touch()
    wait_until(lambda: len(os.listdir(config.barrier)) >= config.parties, f"{config.parties} steps at once")
    Path(config.output_path).mkdir(parents=True, exist_ok=True)


def test_ray_runs_as_many_steps_at_once_as_the_cluster_takes(tmp_path, local_ray):
    """The driver's CPU count does not cap a Ray run: more steps than max(4, CPUs) run together."""
    parties = max(4, os.cpu_count() or 1) + 1
    barrier = tmp_path / "barrier"
    barrier.mkdir()

    def party(index: int) -> ExecutorStep:
        config = BarrierConfig(THIS_OUTPUT_PATH, str(barrier), parties, versioned(index))
        # No CPUs asked, so that the cluster's CPUs do not cap the steps either.
        return ExecutorStep(f"party{index}", meet_at_barrier, config, resources=ResourceConfig(cpus=0))

    steps = [party(index) for index in range(parties)]
    executor = Executor(str(tmp_path / "out"), backend="ray")
    executor.run(steps)
    assert all(read_status(executor.output_paths[step]) == "SUCCESS" for step in steps)


def test_shard_tasks_reserve_their_memory_budget(tmp_path, local_ray):
    # Two CPUs, but memory for only one shard at a time: Ray must run the shards one after the other.
    node_memory = min(node["Resources"]["memory"] for node in local_ray.nodes() if node["Alive"])
    assert sharded_steps.ran_at_once(str(tmp_path / "free"), parallelism="ray")
    assert not sharded_steps.ran_at_once(
        str(tmp_path / "budget"), parallelism="ray", memory_bytes=int(0.6 * node_memory)
    )


def worker_state(module: str) -> tuple[int, bool, str]:
    """In a Ray worker: its pid, whether `module` is imported there, its XLA_FLAGS."""
    import sys

    return os.getpid(), module in sys.modules, os.environ.get("XLA_FLAGS", "")


def test_a_local_ray_starts_and_warms_the_workers_of_steps_with_fake_devices_before_they_run(local_ray):
    """The workers of steps with fake CPU devices (an environment of their own) are started when the backend is,
    with the steps' modules imported, and the steps take them: the first train step of `make demo` waited ~10 s
    for its worker after the data steps, and the scaling fit after training ~5 s (its worker had been killed)."""
    from executor.run.backends import make_backend, ray_options

    stand_in = ResourceConfig(cpu_devices_per_host=2)
    steps = [(stand_in, "sharded_steps"), (stand_in, "conftest"), (stand_in, "__main__"), (None, "json")]
    backend = make_backend("ray", None, steps)
    try:
        warm_pids = set(local_ray.get(backend.warming, timeout=120))
        cpus = int(local_ray.cluster_resources()["CPU"])
        assert len(warm_pids) == min(cpus, 3)  # one per CPU, at most one per such step; none for the others
        options = ray_options(stand_in, max_attempts=1)
        probe = local_ray.remote(worker_state).options(**options)
        for pid, imported, xla_flags in local_ray.get([probe.remote("sharded_steps") for _ in warm_pids]):
            assert pid in warm_pids and imported
            assert "--xla_force_host_platform_device_count=2" in xla_flags
    finally:
        backend.close()

