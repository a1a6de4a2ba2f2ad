"""Python's cyclic garbage collector, made to collect rarely while a step runs.

A train or evaluate step traces and compiles large JAX programs: it makes millions of short-lived Python objects
beside the ~10^6 long-lived ones that JAX, Levanter and Ray imported. At Python's default thresholds (700, 10, 10)
the collector starts a young collection every 700 net allocations and a full one every ~70,000, and a full one walks
every tracked object: 0.5 s each in a tiny hero's train worker. Measured on `make demo`'s DAG (2 cores, every
process's collections timed through `gc.callbacks`): 44.6 of its 533 CPU-s in the collector, 8.4%, 70 full
collections in its two train workers alone. With the young threshold at `YOUNG_THRESHOLD` a full collection comes
~14x less often (the older generations' thresholds are counted in young collections); on
tests/steps/train/test_train_expert_parallel.py's five processes the collector's share fell from 7.7% to 2.7%.

The same garbage is collected, later: a young collection holds at most `YOUNG_THRESHOLD` new container objects
(kilobytes to a few megabytes), and a cycle that outlives it is collected by an older generation's pass as before.
Fewer full collections also mean fewer pauses of every thread of the step, its lease heartbeat's included.

Where it applies: every step function's call (executor/run/step_runner.py, whatever the backend) and a gang
member's (executor/run/gang_member.py); `collect_rarely` for a process that exists only to run such code (the test
session's processes, the tests' trainer and compile subprocesses). A process that runs steps on several threads (the
local backend) gets its own thresholds back when the last step leaves; one that raised them further, or turned
automatic collection off, keeps its own.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

YOUNG_THRESHOLD = 10_000
"""Net allocations of container objects between young collections while a step runs (Python's default: 700)."""

_lock = threading.Lock()
_inside = 0
_saved: tuple[int, ...] | None = None


def _raised(thresholds: tuple[int, ...]) -> tuple[int, ...]:
    young, *older = thresholds
    if not young:  # 0: the process turned automatic collection off; it stays off
        return thresholds
    return (max(young, YOUNG_THRESHOLD), *older)


@contextlib.contextmanager
def rare_collections() -> Iterator[None]:
    """Inside, the collector's young threshold is at least `YOUNG_THRESHOLD`; the process's thresholds come back
    when the last of the threads inside leaves. Nests, and is safe from several threads at once."""
    global _inside, _saved
    with _lock:
        if _inside == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*_raised(_saved))
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None


def collect_rarely() -> None:
    """What `rare_collections` sets, for the rest of this process: one that exists to run a step's code or compile
    its programs (a test's or a benchmark's subprocess, the test session's own processes)."""
    global _saved
    with _lock:
        if _inside == 0:
            gc.set_threshold(*_raised(gc.get_threshold()))
        elif _saved is not None:  # inside: what comes back when the last thread leaves is the raised thresholds
            _saved = _raised(_saved)
