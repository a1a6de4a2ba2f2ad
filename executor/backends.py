"""Where step functions run. Every backend takes a `StepTask` and returns a future `StepResult`.

`local` runs steps in this process's thread pool, so steps may be closures. The Ray backend
(issue #3) will submit the same `run_step(task)` as a Ray task with the step's resources.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from executor.errors import ConfigError
from executor.step_runner import StepResult, StepTask, run_step
from executor.step_spec import ResourceConfig

BACKENDS = ("local",)


class Backend(Protocol):
    name: str

    def submit(self, task: StepTask, resources: ResourceConfig | None) -> Future[StepResult]: ...

    def close(self) -> None: ...


class LocalBackend:
    name = "local"

    def __init__(self, max_concurrent: int):
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="executor-step")

    def submit(self, task: StepTask, resources: ResourceConfig | None) -> Future[StepResult]:
        return self._pool.submit(run_step, task)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def check_backend_name(name: str) -> None:
    if name not in BACKENDS:
        hint = " (the Ray backend is issue #3 and not built yet)" if name == "ray" else ""
        raise ConfigError(f"unknown backend {name!r}{hint}; choose one of {', '.join(BACKENDS)}")


def make_backend(name: str, max_concurrent: int) -> Backend:
    check_backend_name(name)
    return LocalBackend(max_concurrent)
