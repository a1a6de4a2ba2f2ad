"""What a step's process has got done: the last step it completed and what it is busy with, for the gang watch.

A gang member that answers its heartbeat may still be stuck: a rank sleeping or wedged inside the step while its
peers wait in a collective answers `ping` from another thread all along. So a step function that loops over
steps says how far it got, and the driver (executor/gang.py) calls the gang hung when no member has advanced for
`ResourceConfig.hang_timeout_s`:

    from executor import progress
    for step in range(start, steps):
        train_one_step()
        progress.report(step)            # a completed step: the gang advanced
    with progress.phase("checkpoint"):   # a slow part with its own allowance (`checkpoint_timeout_s`)
        save()

Before the first `report` the gang has `first_step_timeout_s` (compiling); inside `phase("checkpoint")` it has
`checkpoint_timeout_s` from the phase's start. A step function that never reports is watched by its heartbeat
alone. The state is one per process (a gang member is one process) and guarded by a lock: `report` is called from
the training loop, `snapshot` from the heartbeat's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHECKPOINT = "checkpoint"
"""The phase a checkpoint save runs in."""

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
