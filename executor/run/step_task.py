"""What a backend hands a worker and gets back: a `StepTask` in, a `StepResult` out (executor/run/step_runner.py
runs one). Plain data, so a thread, a process pool or a Ray task can carry it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from executor.retry import RetryPolicy
from executor.store.lease import LeaseSettings


class Outcome(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    """This worker ran the step and it succeeded."""
    DONE_ELSEWHERE = "DONE_ELSEWHERE"
    """Another worker finished it (before or while this one waited)."""
    FAILED = "FAILED"
    """This worker ran it and it raised."""
    FAILED_ELSEWHERE = "FAILED_ELSEWHERE"
    """Another worker ran it while this one waited, and it failed."""
    DEP_FAILED = "DEP_FAILED"
    """Not run: a blocking dependency failed."""


@dataclass(frozen=True)
class StepResult:
    outcome: Outcome
    message: str | None = None
    taken_over: bool = False
    """This worker ran the step on a lease it took over from a holder that was gone (stale, or dead here)."""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.SUCCEEDED, Outcome.DONE_ELSEWHERE)


@dataclass
class StepTask:
    """Everything a worker needs to run one step."""

    label: str
    output_path: str
    fn: Callable[[Any], Any]
    config: Any
    info: dict[str, Any]
    fingerprint: str | None
    force: bool
    """Run even if SUCCESS (force_run); a SUCCESS newer than `planned_at` still counts as done."""
    planned_at: str
    worker_id: str
    """The executor's id; each call of `run_step` adds a suffix of its own."""
    lease_settings: LeaseSettings
    retry: RetryPolicy
    pinned_digest: str | None = None
    """The output digest a pin file holds for this step: committing other bytes is FAILED, not SUCCESS."""
    pin_file: str | None = None

    @property
    def run_id(self) -> str:
        """This executor run: its RUNNING events say so, and its retry budget counts only them."""
        return f"{self.worker_id}@{self.planned_at}"
