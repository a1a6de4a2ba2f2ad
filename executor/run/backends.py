"""Where step functions run. Every backend takes a `StepTask` and returns a future `StepResult`.

- `local`: this process's thread pool, so steps may be closures.
- `ray`: each step is a Ray task with the step's resources, on the cluster named by `RAY_ADDRESS`,
  or on a local Ray started on demand (this machine's CPUs, a temp dir of ours, no dashboard).
  Steps that fan out launch their shard tasks from inside (see executor/shards/runner.py). A task whose worker
  or node dies is retried by Ray (`max_retries`); the retried call waits for the dead attempt's
  lease to go stale, then takes it over. Every ready step is submitted (unless `max_concurrent`
  caps it): the cluster's resources, not the driver's CPU count, decide how many run at once. On a
  cluster the prefix must be storage every node sees (`check_backend`).

Both call the same `run_step(task)`, so a DAG runs unchanged on either. A step that spans hosts
(`ResourceConfig(hosts=N)`, N > 1) runs on either as a gang (executor/run/gang.py): `run_step` in a driver
thread of this process, which holds the step's lease while the gang's N members run as Ray actors. A
one-host step that asks for fake CPU devices (`cpu_devices_per_host`) gets them on either (executor/run/cpu_devices.py).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from executor.dag.spec import ResourceConfig
from executor.errors import ConfigError
from executor.run.cpu_devices import claim_for_steps, on_cpu_devices, single_host_devices, stand_in_environment
from executor.run.gang import gang_task
from executor.run.interrupts import StopSignal
from executor.run.step_runner import record_worker_killed, run_step
from executor.run.step_task import StepResult, StepTask
from executor.store import storage

logger = logging.getLogger(__name__)

BACKENDS = ("local", "ray")
StepKind = tuple[ResourceConfig | None, str]
"""A step to run, as a backend sees it before it starts: its resources and its function's module."""


class Backend(Protocol):
    name: str
    max_in_flight: int | None
    """Steps submitted at once; None: no cap (the cluster's resources decide)."""

    def submit(self, task: StepTask, resources: ResourceConfig | None) -> Future[StepResult]: ...

    def interrupt(self) -> None:
        """The user interrupted the run: stop running steps (recorded FAILED) and start no more."""

    def abandon_stuck(self) -> int:
        """After `interrupt`, give up on the steps still running (blocked in a native call): record them FAILED,
        free their leases, and leave their threads behind (or kill their worker processes); how many were."""
        ...

    def close(self) -> None: ...


def default_local_concurrency() -> int:
    """Steps at once on this machine when the user sets none: steps often wait on I/O, so at least 4."""
    return max(4, os.cpu_count() or 1)


class LocalBackend:
    """Each step in a daemon thread of this process (the scheduler keeps at most `max_in_flight` running): a
    step abandoned after Ctrl-C, blocked in a native call, never keeps the process from exiting, where a
    `ThreadPoolExecutor`'s workers are joined at interpreter exit."""

    name = "local"

    def __init__(self, max_concurrent: int | None, step_resources: Iterable[ResourceConfig | None] = ()):
        self.max_in_flight: int | None = max_concurrent or default_local_concurrency()
        claim_for_steps(step_resources)  # this process's JAX, before any step runs in it
        self._stop = StopSignal()

    def submit(self, task: StepTask, resources: ResourceConfig | None) -> Future[StepResult]:
        if resources is not None and resources.hosts > 1:
            ensure_ray()  # a gang's members are Ray actors, even under the local backend
            task = gang_task(task, resources)
        step_task = on_cpu_devices(task, resources)
        return in_daemon_thread(run_step, step_task, self._stop, name=f"executor-step:{task.label}")

    def interrupt(self) -> None:
        self._stop.set()

    def abandon_stuck(self) -> int:
        return self._stop.abandon_running()

    def close(self) -> None:
        pass


def in_daemon_thread(fn: Any, *args: Any, name: str) -> Future[Any]:
    """`fn(*args)` in a daemon thread of its own; its result or exception in the future."""
    future: Future[Any] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # the caller sees every outcome, a KeyboardInterrupt included
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


LOCAL_IDLE_WORKERS_PER_CPU = 2
"""A local Ray keeps this many idle workers per CPU (Ray's default: one), see `ensure_ray`."""
LOCAL_IDLE_WORKER_SECONDS = 60
"""...and kills those beyond that only once idle this long (Ray's default: 1 s)."""
LOCAL_RAY_START_ATTEMPTS = 3
"""A local Ray's raylet gives its agents a fixed ~15 s to start; on a busy 2-core machine they can miss it."""


def ray_temp_dir() -> str:
    """Our own folder for a local Ray's sessions, so they do not litter the system temp folder."""
    return os.path.join(tempfile.gettempdir(), f"executor-ray-{os.getuid()}")


def ensure_ray() -> None:
    """Connect to `RAY_ADDRESS` if set, else start a local Ray, unless Ray is already initialized."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        # The cluster (or the `ray job submit` that started us) provides the environment; a
        # runtime_env here would replace the job's working_dir.
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=True)
    else:
        # Local workers import step functions by module name: give them the driver's import path.
        runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}}
        num_cpus = os.cpu_count() or 1
        # Ray keeps idle workers up to a soft limit (default: the CPUs) and kills the rest once idle for a second.
        # Steps with fake CPU devices run in workers of their own environment, so with the defaults the data
        # steps' workers were killed while training ran (the scaling fit after it waited ~5 s for a new worker to
        # start and import its modules), and the workers warmed for training were killed while the data steps'
        # shard tasks ran. Keep one per CPU for two environments, and any worker for a minute.
        system_config = {
            "num_workers_soft_limit": LOCAL_IDLE_WORKERS_PER_CPU * num_cpus,
            "idle_worker_killing_time_threshold_ms": LOCAL_IDLE_WORKER_SECONDS * 1000,
        }
        for attempt in range(1, LOCAL_RAY_START_ATTEMPTS + 1):
            logger.info("starting a local Ray with %d CPUs (temp dir %s)", num_cpus, ray_temp_dir())
            try:
                ray.init(
                    num_cpus=num_cpus, include_dashboard=False, _temp_dir=ray_temp_dir(), runtime_env=runtime_env,
                    log_to_driver=True, _system_config=system_config,
                )  # fmt: skip
                return
            except Exception as error:  # Ray raises a bare Exception when its node times out during startup
                ray.shutdown()
                if attempt == LOCAL_RAY_START_ATTEMPTS or "timed out during startup" not in str(error):
                    raise
                logger.warning("the local Ray did not start (%s); starting it again", error)


def ray_options(resources: ResourceConfig | None, max_attempts: int) -> dict[str, Any]:
    """Ray task options for a step's resources; retries cover lost workers and nodes only."""
    resources = resources or ResourceConfig()
    accelerated = bool(resources.gpus or resources.accelerator_type)
    options: dict[str, Any] = {
        "num_cpus": resources.cpus if resources.cpus is not None else (0 if accelerated else 1),
        "num_gpus": resources.gpus,
        "max_retries": max_attempts - 1,
        "retry_exceptions": False,
    }
    if resources.memory_gb:
        options["memory"] = int(resources.memory_gb * 2**30)
    if resources.accelerator_type:
        options["accelerator_type"] = resources.accelerator_type
    if resources.custom:
        options["resources"] = dict(resources.custom)
    if (devices := single_host_devices(resources)) is not None:
        # A worker process of its own, whose JAX loads with these devices (executor/run/cpu_devices.py).
        options["runtime_env"] = {"env_vars": stand_in_environment(devices)}
    return options


def _run_step_in_ray(task: StepTask) -> StepResult:
    root = logging.getLogger()
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)  # so the step's INFO lines reach its logs/step.log
    return run_step(task)


WARM_BARRIER_S = 30.0
"""How long a warm-up task waits for the others of its environment to reach their workers (`_warm_worker`)."""


def _warm_worker(modules: tuple[str, ...], barrier: str = "", count: int = 1) -> int:
    """Import `modules` in this worker, so that the step that reuses it starts at once; its pid. A module
    that fails to import is left to fail its step, with the step's name on the error.

    The `count` warm-ups of one environment meet at `barrier` (a folder of this machine: one file per worker) and
    return together, at most `WARM_BARRIER_S` later: a warm-up that finished first would otherwise free its worker
    for the next one, and a loaded machine warmed one worker where the steps need two."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # only a warm-up: the step itself reports the error
            logger.debug("warm-up: %s did not import", module, exc_info=True)
    if barrier:
        with contextlib.suppress(OSError):  # the driver may have closed the backend already
            open(os.path.join(barrier, str(os.getpid())), "w").close()
        deadline = time.monotonic() + WARM_BARRIER_S
        while time.monotonic() < deadline:
            try:
                if len(os.listdir(barrier)) >= count:
                    break
            except OSError:
                break
            time.sleep(0.05)
    return os.getpid()


class RayBackend:
    name = "ray"

    def __init__(self, max_concurrent: int | None, steps: Iterable[StepKind] = ()):
        import ray

        # The driver's CPUs say nothing about the cluster's: by default every ready step is
        # submitted and Ray runs as many as the cluster's resources allow.
        self.max_in_flight = max_concurrent
        ensure_ray()
        self._ray = ray
        self._remote = ray.remote(_run_step_in_ray)
        self._refs: list[tuple[Any, StepTask]] = []
        self.warming: list[Any] = []
        """The warm-up tasks' refs (each gives its worker's pid): see `_warm_stand_in_workers`."""
        self._warm_barriers: list[str] = []
        if not os.environ.get("RAY_ADDRESS"):  # on a cluster, steps land on nodes no warm-up can foresee
            self._warm_stand_in_workers(steps)
        # A gang's driver runs here, holding the step's lease while its members run as Ray actors.
        self._gang_drivers = ThreadPoolExecutor(thread_name_prefix="executor-gang")
        self._stop = StopSignal()

    def _warm_stand_in_workers(self, steps: Iterable[StepKind]) -> None:
        """On a local Ray, start now the workers that the steps with fake CPU devices will run in (one
        environment per device count, as many as the CPUs or such steps), importing those steps' modules
        (JAX, Levanter): the first such step otherwise waited ~10 s for its worker after the data steps. The
        warm-up tasks ask for no CPU, so they wait on no step; the step that comes next takes the idle worker
        (kept by `ensure_ray`'s idle-worker settings while the data steps' shard tasks start workers of their own)."""
        by_count: dict[int, list[str]] = {}
        for resources, module in steps:
            if (count := single_host_devices(resources)) is not None:
                by_count.setdefault(count, []).append(module)  # "" or __main__: nothing to import
        cpus = int(self._ray.cluster_resources().get("CPU", 1))
        warm: Any = self._ray.remote(_warm_worker)  # Ray types a remote function by its arity, defaults unseen
        for count, modules in sorted(by_count.items()):
            options = {"num_cpus": 0, "max_retries": 0, "runtime_env": {"env_vars": stand_in_environment(count)}}
            importable = tuple(sorted({module for module in modules if module and module != "__main__"}))
            workers = min(cpus, len(modules))
            barrier = tempfile.mkdtemp(prefix="executor-warm-") if workers > 1 else ""
            if barrier:
                self._warm_barriers.append(barrier)
            for _ in range(workers):
                self.warming.append(warm.options(**options).remote(importable, barrier, workers))

    def submit(self, task: StepTask, resources: ResourceConfig | None) -> Future[StepResult]:
        if resources is not None and resources.hosts > 1:
            return self._gang_drivers.submit(run_step, gang_task(task, resources), self._stop)
        options = ray_options(resources, task.retry.max_attempts)
        ref = self._remote.options(**options).remote(on_cpu_devices(task, resources))
        self._refs.append((ref, task))
        return ref.future()

    def interrupt(self) -> None:
        """Cancel the step tasks: each gets a KeyboardInterrupt, records FAILED and frees its lease; gang drivers
        stop (tearing their gangs down) the same way."""
        self._stop.set()
        for ref, _task in self._refs:
            self._ray.cancel(ref)

    def abandon_stuck(self) -> int:
        """Gang drivers run here (their steps' threads: abandoned as on the local backend). A step task still
        running (blocked in a native call, where the KeyboardInterrupt never lands) has its worker process killed
        (`ray.cancel(force=True)`, its shard tasks with it) and is recorded FAILED `WORKER_KILLED`, its lease freed
        (on a remote node, whose pids this host cannot see, the lease frees itself when it goes stale)."""
        stuck = [(ref, task) for ref, task in self._refs if not self._ray.wait([ref], timeout=0)[0]]
        for ref, _task in stuck:
            self._ray.cancel(ref, force=True)
        for ref, task in stuck:
            with contextlib.suppress(Exception):  # the killed task's error, or a result that came first
                self._ray.wait([ref], timeout=5)
            if not record_worker_killed(task):
                logger.warning("%s: its Ray worker was killed; its lease frees itself once stale", task.label)
        return self._stop.abandon_running() + len(stuck)

    def close(self) -> None:
        """Ray stays up for the rest of the process; it shuts itself down at exit."""
        self._gang_drivers.shutdown(wait=not self._stop.is_set(), cancel_futures=True)
        for barrier in self._warm_barriers:
            shutil.rmtree(barrier, ignore_errors=True)


def check_backend(name: str, prefix: str, shared_filesystem: bool = False) -> None:
    """Refuse a backend that cannot see `prefix` the same way from every worker."""
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "ray" and prefix.startswith("memory://"):
        raise ConfigError(
            f"prefix {prefix} lives in this process's memory, which Ray workers cannot see; "
            "use a local folder, gs:// or s3:// with the ray backend"
        )
    address = os.environ.get("RAY_ADDRESS")
    if name == "ray" and address and storage.on_local_disk(prefix) and not shared_filesystem:
        raise ConfigError(
            f"prefix {prefix} is a folder on this machine's disk, but --backend ray with RAY_ADDRESS={address} runs "
            "steps on the cluster's nodes: each node would write outputs, statuses and leases to its own disk, "
            "so steps would run twice and outputs would be split across nodes. Use an object-store prefix "
            "(gs://..., s3://...), or, if this folder is mounted on every node (NFS, a shared volume), pass "
            "--shared_filesystem true (Executor(..., shared_filesystem=True))"
        )


def check_gang_storage(steps: Iterable[tuple[str, str, ResourceConfig | None]], shared_filesystem: bool) -> None:
    """Refuse a gang of real hosts (`hosts` > 1 without stand-in CPU devices) whose output is a folder on this
    machine's disk: each host would write its checkpoint shards, logs and metrics to its own disk, and a resume on
    another set of hosts would find a fraction of a checkpoint. `steps` are (label, output path, resources)."""
    if shared_filesystem:
        return
    for label, output_path, resources in steps:
        if resources is None or resources.hosts < 2 or resources.cpu_devices_per_host is not None:
            continue
        if storage.on_local_disk(output_path):
            raise ConfigError(
                f"{label} runs as a gang of {resources.hosts} hosts, but its output {output_path} is a folder on this "
                "machine's disk: each host would write its share of every checkpoint to its own disk. Use an "
                "object-store prefix (gs://..., s3://...), or, if this folder is mounted on every host (NFS, a "
                "shared volume), pass --shared_filesystem true (Executor(..., shared_filesystem=True)); nothing was "
                "run or written"
            )


def make_backend(name: str, max_concurrent: int | None, steps: Iterable[StepKind] = ()) -> Backend:
    """The backend `name`; `steps` (the resources and function module of each step it will run) let the local
    one set up this process's JAX devices, and a local Ray start their workers, before any step runs."""
    steps = list(steps)
    if name == "ray":
        return RayBackend(max_concurrent, steps)
    return LocalBackend(max_concurrent, [resources for resources, _ in steps])
