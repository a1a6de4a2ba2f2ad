"""Stopping a step's thread from outside: the user's Ctrl-C (`StopSignal`) and a lost lease.

A step function is ordinary Python running in a worker thread; the only way to stop it without its
cooperation is an exception raised asynchronously in that thread (`PyThreadState_SetAsyncExc`).
`Interrupter` aims that exception at the thread only while the step function runs, so the runner's
own bookkeeping (status writes, lease release) is never cut in half.

Such an exception is raised only when the thread runs Python again: a step blocked in a native call (a read
that never returns, a C library's loop) does not see it. After Ctrl-C the scheduler waits a moment and then
*abandons* the steps still inside their functions (`StopSignal.abandon_running`): each one's callback, given
by the runner, records FAILED "interrupted by the user", stops its heartbeat and frees its lease from the
interrupting thread, and the step's own thread, should it ever come back, records nothing. The thread itself
is a daemon (executor/run/backends.py), so the process exits without waiting for it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable


class StepAborted(BaseException):
    """Raised inside a step's thread when its lease is lost."""


class StepInterrupted(BaseException):
    """Raised inside a step's thread when the user interrupts the executor (Ctrl-C)."""


STOP_GRACE_S = 2.0
"""After Ctrl-C, how long a step function gets to stop before it is abandoned: one blocked in a native call never
sees the exception that stops it, and the user asked for the run to end."""


class StopSignal:
    """Set when the user interrupts a run: running steps are interrupted, waiting ones give up.

    Each backend owns one; `run_step` registers the step it is running with it.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._running: set[Interrupter] = set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            for interrupter in self._running:
                interrupter.interrupt(StepInterrupted)

    def is_set(self) -> bool:
        return self._event.is_set()

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early if the signal is set."""
        self._event.wait(seconds)

    def register(self, interrupter: Interrupter) -> None:
        with self._lock:
            self._running.add(interrupter)
            if self._event.is_set():
                interrupter.interrupt(StepInterrupted)

    def unregister(self, interrupter: Interrupter) -> None:
        with self._lock:
            self._running.discard(interrupter)

    def abandon_running(self) -> int:
        """Give up on every step still inside its function (the module docstring); how many were."""
        with self._lock:
            running = list(self._running)
        return sum(interrupter.abandon() for interrupter in running)


class Interrupter:
    """Raises an exception inside the step's thread, but only while the step function runs."""

    def __init__(self, on_abandon: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._thread_id: int | None = None
        self._on_abandon = on_abandon
        self.abandoned = False
        """Given up on while its function ran: the step's thread must record nothing (the abandoner did)."""

    def __enter__(self) -> None:
        with self._lock:
            self._thread_id = threading.get_ident()

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            if self._thread_id is not None:
                # Clear an interrupt that was sent but not yet raised: from here on we are our own code.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), None)
            self._thread_id = None

    def abandon(self) -> bool:
        """If the step function is still running, mark it abandoned and run the `on_abandon` callback (in this
        thread); False if it already returned (its thread records its own outcome) or none was given."""
        with self._lock:
            if self._thread_id is None or self._on_abandon is None or self.abandoned:
                return False
            self.abandoned = True
        self._on_abandon()
        return True

    def interrupt(self, exception: type[BaseException]) -> None:
        with self._lock:
            if self._thread_id is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), ctypes.py_object(exception))
