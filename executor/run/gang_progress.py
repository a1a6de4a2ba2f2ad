"""What a step's process has got done: the last step it completed and what it is busy with, for the gang watch.

A gang member that answers its heartbeat may still be stuck: a rank sleeping or wedged inside the step while its
peers wait in a collective answers `ping` from another thread all along. So a step function that loops over
steps runs the loop in a phase and says how far it got, and the driver (executor/run/gang.py) calls the gang hung when,
while any member is in a phase, no member has advanced for `ResourceConfig.hang_timeout_s`:

    from executor import progress
    with progress.phase("training"):         # from here the gang must advance
        for step in range(start, steps):
            train_one_step()
            progress.report(step)            # a completed step: the gang advanced
            if due:
                with progress.phase(progress.CHECKPOINT):   # its own allowance (`checkpoint_timeout_s`)
                    save()
    export()                                 # outside any phase: watched by the heartbeat alone

Before the first `report` the gang has `first_step_timeout_s` (compiling); inside `phase(CHECKPOINT)` it has
`checkpoint_timeout_s` from the phase's start, and inside `phase(EVAL)` (an eval between two steps, the first of
which compiles its own program) `eval_timeout_s`. A step function that never enters a phase is watched by its
heartbeat alone. The state is one per process (a gang member is one process) and guarded by a lock: `report` is
called from the training loop, `snapshot` from the heartbeat's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHECKPOINT = "checkpoint"
"""The phase a checkpoint save runs in."""
EVAL = "eval"
"""The phase an eval between two training steps runs in."""

_lock = threading.Lock()
_state: dict[str, Any] = {"step": None, "reported_at": None, "phase": None, "phase_since": None}


def report(step: int) -> None:
    """`step` is complete."""
    with _lock:
        _state["step"], _state["reported_at"] = step, time.time()


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark a slow part of the step (`CHECKPOINT`) for as long as it runs."""
    with _lock:
        outer = _state["phase"], _state["phase_since"]
        _state["phase"], _state["phase_since"] = name, time.time()
    try:
        yield
    finally:
        with _lock:
            _state["phase"], _state["phase_since"] = outer


def snapshot() -> dict[str, Any]:
    """The last completed step (None before any), when it was reported, and the phase now, as wall-clock times."""
    with _lock:
        return dict(_state)


def reset() -> None:
    """Forget what was reported: a new step function starts in this process."""
    with _lock:
        _state.update(step=None, reported_at=None, phase=None, phase_since=None)


class ProgressWatch:
    """The driver's side: whether a gang still advances, from its members' `snapshot`s (the module docstring's
    rule). Times are the driver's own monotonic clock: a phase counts from when the driver first saw it, so the
    hosts' clocks never enter."""

    def __init__(
        self,
        hang_timeout_s: float,
        first_step_timeout_s: float,
        checkpoint_timeout_s: float,
        now: float,
        eval_timeout_s: float | None = None,
    ):
        self.hang_timeout_s = hang_timeout_s
        self.first_step_timeout_s = first_step_timeout_s
        self.phase_allowances = {CHECKPOINT: checkpoint_timeout_s}
        """Each phase's own allowance from its start, on top of the step's (an eval's only where it is given)."""
        if eval_timeout_s is not None:
            self.phase_allowances[EVAL] = eval_timeout_s
        self.advanced_at = now
        self.steps: dict[int, int] = {}
        self.phases: dict[int, tuple[str, float]] = {}

    def heard(self, rank: int, snapshot: dict[str, Any], now: float) -> None:
        step, name = snapshot.get("step"), snapshot.get("phase")
        if step is not None and step != self.steps.get(rank):
            self.steps[rank], self.advanced_at = step, now
        if name is None:
            self.phases.pop(rank, None)
        elif self.phases.get(rank, ("", 0.0))[0] != name:
            self.phases[rank] = (name, now)

    def stalled(self, now: float) -> str | None:
        """Why the gang is hung (no member advanced within its allowance while one is in a phase), or None."""
        if not self.phases:
            return None
        allowed, what = (self.hang_timeout_s, "a step") if self.steps else (self.first_step_timeout_s, "its first step")
        deadline = self.advanced_at + allowed
        for name, allowance in self.phase_allowances.items():
            started = [since for phase, since in self.phases.values() if phase == name]
            if started:
                deadline = max(deadline, min(started) + allowance)
        if now <= deadline:
            return None
        last = f"last completed steps by member {self.steps}" if self.steps else "no step completed yet"
        return (
            f"no member completed {what} for {now - self.advanced_at:.0f} s (allowed {allowed:.0f} s; {last}), "
            "though every member answers its heartbeat: one is stuck inside the step and the others wait for it "
            "in a collective"
        )
