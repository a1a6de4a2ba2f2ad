"""Shared fixtures: small real step functions whose calls are counted, and fast lease timings."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import pytest

from executor import THIS_OUTPUT_PATH, ExecutorStep, output_path_of, versioned
from executor.run.collector import collect_rarely
from executor.run.cpu_devices import with_stand_in_flags

# The gcs_emulator and s3_server fixtures; the tiny hero run; the browser tests' Chromium and page; the markers a
# test gets from what it uses and the quick tier (--quick); the per-file durations table (--durations-table).
pytest_plugins = ["services", "hero_run", "browser_fixtures", "tiers", "durations_table"]


class CallLog:
    """Counts step-function calls by step name, across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()

    def record(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1


CALLS = CallLog()


@dataclass(frozen=True)
class WriteConfig:
    """Writes `text` (plus its inputs' text) to `<output_path>/out.txt`."""

    name: str
    output_path: str
    text: str = "x"
    inputs: tuple[str, ...] = ()
    refs: tuple[str, ...] = ()
    """Paths only referenced (pseudo-dependencies): never read."""
    fail: bool = False


def write_text(config: WriteConfig) -> None:
    CALLS.record(config.name)
    if config.fail:
        raise RuntimeError(f"{config.name} was told to fail")
    parts = [config.text]
    for path in config.inputs:
        with fsspec.open(path, "r") as handle:
            parts.append(handle.read())
    with fsspec.open(f"{config.output_path}/out.txt", "w", auto_mkdir=True) as handle:
        handle.write("+".join(parts))


def make_step(name: str, *deps: ExecutorStep, text: str = "x", fail: bool = False, nonblocking=()) -> ExecutorStep:
    inputs = tuple(output_path_of(dep, "out.txt") for dep in deps)
    refs = tuple(output_path_of(dep, "out.txt").nonblocking() for dep in nonblocking)
    return ExecutorStep(
        name=name,
        fn=write_text,
        config=WriteConfig(
            name=name, output_path=THIS_OUTPUT_PATH, text=versioned(text), inputs=inputs, refs=refs, fail=fail
        ),
    )


@pytest.fixture
def calls() -> CallLog:
    CALLS.counts.clear()
    return CALLS


@pytest.fixture
def fast_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    # A holder stops its step when it could not renew for half the stale interval: 4 s leaves room
    # for renewals delayed on a loaded test machine (many threads, few cores, moto answering slowly).
    monkeypatch.setenv("EXECUTOR_LEASE_HEARTBEAT_S", "0.2")
    monkeypatch.setenv("EXECUTOR_LEASE_STALE_S", "8.0")


def race(count: int, attempt: Callable[[int], bool]) -> list[int]:
    """Run `attempt(i)` for i < count in threads released at the same instant; the indexes that won."""
    start = threading.Barrier(count)
    winners: list[int] = []

    def contend(index: int) -> None:
        start.wait()
        if attempt(index):
            winners.append(index)

    threads = [threading.Thread(target=contend, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return winners


def plant_crashed_holder(output_path: str, worker: str = "crashed-worker") -> None:
    """Leave what a worker killed mid-step leaves: its lease (heartbeat long ago) and a RUNNING event."""
    from executor import storage
    from executor.store.events import StatusEvent, StepStatus, append_event

    long_ago = "2026-01-01T00:00:00+00:00"
    record = {"worker": worker, "number": 0, "acquired": long_ago, "heartbeat": long_ago}
    storage.write_atomic(f"{output_path}/.executor_lease/0000000000.json", json.dumps(record))
    append_event(output_path, StatusEvent(StepStatus.RUNNING, time=long_ago, attempt=1, worker=worker))


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = 120) -> None:
    """Poll until `predicate()` is true; a generous bound for slow machines, never a speed assertion."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def run_in_threads(count: int, work: Callable[[], object]) -> list[BaseException]:
    """Run `work` in `count` threads at once; the exceptions they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except Exception as error:  # returned to the test, which asserts on it
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@contextlib.contextmanager
def ray_cluster_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Ray cluster of raylets on this machine (`ray.cluster_utils.Cluster`: a 1-CPU head, the caller adds nodes),
    named by RAY_ADDRESS so the executor's Ray backend joins it; workers import the tests' step modules through
    PYTHONPATH, which they inherit. Shut down, with this process's Ray, on exit."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in sys.path if path))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def pytest_configure(config: pytest.Config) -> None:
    """The session's JAX settings, which its xdist workers and every process a test starts (a step's subprocess, a
    Ray worker, a gang member) inherit through the environment: the stand-in hosts' XLA flags, and one persistent
    compilation cache, so that a program compiled once (the same tiny model trained, killed and resumed, rerun,
    evaluated) loads the second time. A cached executable is the one a fresh compile would give, so no result
    changes. Set JAX_COMPILATION_CACHE_DIR yourself to keep a cache across sessions.

    Every process of the session (the controller and each xdist worker, which trains and compiles in-process too)
    runs Python's garbage collector as a step does (executor/run/collector.py)."""
    collect_rarely()
    if hasattr(config, "workerinput"):
        return  # a worker inherits the controller's environment
    # A local Ray runs its workers at nice 15 (Ray's default), and the suite's own workers train at nice 0 beside
    # them: on 2 busy cores a step in a Ray worker got a few percent of a core (the tiny hero's d1024 at 16.7 s a
    # step in CI). The tests' Ray workers share the CPUs as equals (raylet reads RAY_worker_niceness at its start).
    os.environ.setdefault("RAY_worker_niceness", "0")
    # wandb off in the suite's training runs: offline, each run starts wandb's service process and imports its
    # launch module (test_train.py: 245 CPU-s with it, 185 without). The runs whose wandb files a test reads keep
    # it as shipped (tests/support/paths.py `with_wandb_as_shipped`): the tiny hero DAG, test_train's killed run
    # and its GCS run, test_fork's runs.
    os.environ.setdefault("WANDB_MODE", "disabled")
    # Tests compile much and run little, as the stand-in hosts do: LLVM's level 1 (executor/run/cpu_devices.py).
    os.environ["XLA_FLAGS"] = with_stand_in_flags(os.environ.get("XLA_FLAGS", ""))
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return  # a caller's own cache stands
    folder = tempfile.mkdtemp(prefix="jax-compilation-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if "jax" in sys.modules:  # JAX reads the environment once, when imported
        import jax

        jax.config.update("jax_compilation_cache_dir", folder)
        minimum = float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", minimum)
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


FIRST = "tests/e2e/test_hero_tiny.py"
"""The tiny hero's whole run and every test that reads it (one session fixture): the longest file, sent first."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs the suite in three pytest-xdist workers (`-n 3 --dist loadfile`): each test file is one unit
    of work, so its module and session fixtures are built once. Files go out in this order: the tiny hero's
    first, then files with slow tests, so that the long ones do not start last. Without xdist only the order
    changes. (xdist's `loadgroup` would group across files, but its marks do nothing under pytest 9.)"""

    def unit(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow_files = {unit(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (unit(item) != FIRST, unit(item) not in slow_files))
