"""Run one step exactly once across every executor that shares its output path.

`run_step(task)` is self-contained (a task object in, an outcome out) so that any backend can
call it: a thread here, a Ray task later. The sequence is

    wait until the step is SUCCESS (skip) or its lease can be taken
    -> .executor_info, RUNNING -> fn(config) under a heartbeat -> manifest -> SUCCESS (last)

and on an exception FAILED with the traceback. If the heartbeat finds the lease taken over, the
step function is interrupted (an exception raised in its thread), nothing more is written, and
the worker goes back to waiting for the new holder's result.
"""

from __future__ import annotations

import ctypes
import logging
import os
import tempfile
import threading
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from executor import storage
from executor.errors import LeaseLostError
from executor.lease import Heartbeat, Lease, LeaseSettings
from executor.records import info_path, write_manifest
from executor.retry import RetryPolicy, is_transient
from executor.status import (
    LOG_FILE,
    StatusEvent,
    StepStatus,
    append_event,
    attempts_so_far,
    parse_time,
    read_events,
)

logger = logging.getLogger(__name__)


class StepAborted(BaseException):
    """Raised inside a step's thread when its lease is lost."""


class StepInterrupted(BaseException):
    """Raised inside a step's thread when the user interrupts the executor (Ctrl-C)."""


class StopSignal:
    """Set when the user interrupts a run: running steps are interrupted, waiting ones give up.

    Each backend owns one; `run_step` registers the step it is running with it.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._running: set[_Interrupter] = set()

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

    def register(self, interrupter: _Interrupter) -> None:
        with self._lock:
            self._running.add(interrupter)
            if self._event.is_set():
                interrupter.interrupt(StepInterrupted)

    def unregister(self, interrupter: _Interrupter) -> None:
        with self._lock:
            self._running.discard(interrupter)


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


def run_step(task: StepTask, stop: StopSignal | None = None) -> StepResult:
    # One worker id per call: a retried Ray task must not mistake its dead predecessor's lease for its own.
    worker_id = f"{task.worker_id}/{uuid.uuid4().hex[:6]}"
    lease = Lease(task.output_path, worker_id, task.lease_settings)
    stop = stop or StopSignal()
    while True:
        done = _wait_for_lease(task, lease, stop)
        if done is not None:
            return done
        try:
            result = _run_holding_lease(task, lease, stop)
        except LeaseLostError as error:
            logger.warning("%s: %s; waiting for the new holder", task.label, error)
            continue
        finally:
            lease.release()
        if isinstance(result, StepResult):
            return result
        stop.sleep(result.wait_s)  # a transient failure: back off, then compete for the lease again


def _newer_than_plan(event: StatusEvent, task: StepTask) -> bool:
    return parse_time(event.time) >= parse_time(task.planned_at)


def _finished(task: StepTask, waited: bool) -> StepResult | None:
    """The result if the step needs no run by this worker: SUCCESS, or another's failure we waited on."""
    events = read_events(task.output_path)
    if not events:
        return None
    last = events[-1]
    if last.status == StepStatus.SUCCESS and (not task.force or _newer_than_plan(last, task)):
        return StepResult(Outcome.DONE_ELSEWHERE, f"finished by {last.worker} at {last.time}")
    if waited and last.status == StepStatus.FAILED and _newer_than_plan(last, task):
        return StepResult(Outcome.FAILED_ELSEWHERE, f"failed in {last.worker}: {last.message}")
    return None


def _wait_for_lease(task: StepTask, lease: Lease, stop: StopSignal) -> StepResult | None:
    """None once this worker holds the lease; a result if the step was settled by someone else."""
    waited = False
    while True:
        if stop.is_set():
            return StepResult(Outcome.FAILED, "interrupted before it started")
        done = _finished(task, waited)
        if done is not None:
            return done
        if lease.try_acquire():
            done = _finished(task, waited)  # it may have finished between our look and our lease
            if done is not None:
                lease.release()
            return done
        if not waited:
            holder = lease.current() or {}
            logger.info(
                "%s: %s holds the lease (heartbeat %s); waiting",
                task.label,
                holder.get("worker"),
                holder.get("heartbeat"),
            )
            waited = True
        stop.sleep(task.lease_settings.poll_s)


@dataclass(frozen=True)
class _Retry:
    wait_s: float


def _run_holding_lease(task: StepTask, lease: Lease, stop: StopSignal) -> StepResult | _Retry:
    worker = lease.worker_id
    attempt = attempts_so_far(read_events(task.output_path)) + 1
    started = StatusEvent(StepStatus.RUNNING, attempt=attempt, worker=worker)
    storage.write_json_atomic(info_path(task.output_path), {**task.info, "worker": worker, "started": started.time})
    append_event(task.output_path, started)
    logger.info("%s: RUNNING (attempt %d) %s", task.label, attempt, task.output_path)
    with _StepLog(task.output_path) as step_log:
        interrupter = _Interrupter()

        def on_lost(_error: LeaseLostError) -> None:
            interrupter.interrupt(StepAborted)

        with Heartbeat(lease, on_lost=on_lost, on_tick=step_log.upload) as heartbeat:
            try:
                with interrupter:
                    stop.register(interrupter)
                    try:
                        task.fn(task.config)
                    finally:
                        stop.unregister(interrupter)
                if heartbeat.lost is not None:
                    raise heartbeat.lost
                lease.check()
                write_manifest(task.output_path)
            except StepAborted as aborted:
                raise heartbeat.lost or LeaseLostError(f"{task.label}: aborted") from aborted
            except LeaseLostError:
                raise
            except (StepInterrupted, KeyboardInterrupt) as interrupted:
                # Say so and free the lease at once: the next run reruns the step without waiting.
                step_log.write_exception(interrupted)
                _append_if_holding(task, lease, StatusEvent(
                    StepStatus.FAILED, attempt=attempt, worker=worker, message="interrupted by the user",
                ))  # fmt: skip
                if isinstance(interrupted, KeyboardInterrupt):
                    raise
                return StepResult(Outcome.FAILED, "interrupted by the user")
            except BaseException as error:
                step_log.write_exception(error)
                return _record_failure(task, lease, attempt, error)
    lease.check()
    append_event(
        task.output_path,
        StatusEvent(StepStatus.SUCCESS, attempt=attempt, worker=worker, details={"code_fingerprint": task.fingerprint}),
    )
    logger.info("%s: SUCCESS %s", task.label, task.output_path)
    return StepResult(Outcome.SUCCEEDED)


def _record_failure(task: StepTask, lease: Lease, attempt: int, error: BaseException) -> StepResult | _Retry:
    """FAILED with the traceback; or, for a retryable error with attempts left, WAITING and a backoff."""
    message = f"{type(error).__name__}: {error}"
    details = {"traceback": "".join(traceback.format_exception(error))}
    lease.check()
    if task.retry.should_retry(error, attempt):
        wait_s = task.retry.backoff_s(attempt)
        kind = "transient" if is_transient(error) else "retryable"
        logger.warning("%s: attempt %d failed (%s %s); retrying in %.1fs", task.label, attempt, kind, message, wait_s)
        note = f"attempt {attempt} failed ({kind}): {message}; retrying in {wait_s:.1f}s"
        append_event(
            task.output_path,
            StatusEvent(StepStatus.WAITING, attempt=attempt, worker=lease.worker_id, message=note, details=details),
        )
        return _Retry(wait_s)
    logger.error("%s: FAILED (attempt %d): %s", task.label, attempt, message)
    append_event(
        task.output_path,
        StatusEvent(StepStatus.FAILED, attempt=attempt, worker=lease.worker_id, message=message, details=details),
    )
    return StepResult(Outcome.FAILED, message)


def _append_if_holding(task: StepTask, lease: Lease, event: StatusEvent) -> None:
    try:
        lease.check()
    except LeaseLostError:
        return
    append_event(task.output_path, event)


class _Interrupter:
    """Raises an exception inside the step's thread, but only while the step function runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread_id: int | None = None

    def __enter__(self) -> None:
        with self._lock:
            self._thread_id = threading.get_ident()

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            if self._thread_id is not None:
                # Clear an interrupt that was sent but not yet raised: from here on we are our own code.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), None)
            self._thread_id = None

    def interrupt(self, exception: type[BaseException]) -> None:
        with self._lock:
            if self._thread_id is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), ctypes.py_object(exception))


class _StepLog:
    """Captures log records from the step's thread into `<output>/logs/step.log`."""

    def __init__(self, output_path: str):
        self.target = storage.join(output_path, LOG_FILE)
        self._thread_id = threading.get_ident()
        handle, self._local = tempfile.mkstemp(prefix="executor-step-", suffix=".log")
        os.close(handle)
        existing = storage.read_bytes(self.target)  # keep earlier attempts' logs
        if existing:
            with open(self._local, "wb") as out:
                out.write(existing)
        self._handler = logging.FileHandler(self._local, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._handler.addFilter(lambda record: record.thread == self._thread_id)
        self._upload_lock = threading.Lock()

    def __enter__(self) -> _StepLog:
        logging.getLogger().addHandler(self._handler)
        return self

    def write_exception(self, error: BaseException) -> None:
        self._handler.acquire()
        try:
            with open(self._local, "a", encoding="utf-8") as out:
                self._handler.flush()
                out.write("".join(traceback.format_exception(error)))
        finally:
            self._handler.release()

    def upload(self) -> None:
        with self._upload_lock:
            self._handler.flush()
            storage.upload_file(self._local, self.target)

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger().removeHandler(self._handler)
        try:
            self.upload()
        finally:
            self._handler.close()
            os.unlink(self._local)
