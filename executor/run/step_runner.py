"""Run one step exactly once across every executor that shares its output path.

`run_step(task)` is self-contained (a task object in, an outcome out) so that any backend can
call it: a thread here, a Ray task later. The sequence is

    wait until the step is SUCCESS (skip) or its lease can be taken
    -> .executor_info, RUNNING -> fn(config) under a heartbeat -> manifest -> SUCCESS (last, with the output digest)

all while the heartbeat holds the lease, and on an exception FAILED with the traceback (or WAITING
and a retry, while this executor run has attempts left). If the heartbeat finds the lease taken
over, or cannot renew it in time, the step function is interrupted (an exception raised in its
thread), nothing more is written, and the worker goes back to waiting for the new holder's result.
Every status event carries the writer's lease number, so a taken-over holder's late write is refused.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from executor.dag.pins import PinError, mismatch_message
from executor.dag.records import clear_outputs, info_path, this_cpu, write_manifest
from executor.errors import LeaseLostError
from executor.retry import is_transient
from executor.run.collector import rare_collections
from executor.run.interrupts import Interrupter, StepAborted, StepInterrupted, StopSignal
from executor.run.step_task import Outcome, StepResult, StepTask
from executor.store import storage
from executor.store.events import (
    StatusEvent,
    StepStatus,
    append_event,
    attempts_so_far,
    parse_time,
    read_events,
)
from executor.store.lease import Heartbeat, Lease, LeaseSettings
from executor.store.step_log import StepLog

logger = logging.getLogger(__name__)


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
            return dataclasses.replace(result, taken_over=lease.took_over)
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


@dataclass(frozen=True)
class _Attempt:
    number: int
    """Counted across runs: the n-th RUNNING event of the step's history."""
    in_run: int
    """Counted in this executor run only: what the retry budget is measured against."""
    starts_forced_run: bool = False
    """The first attempt of a forced rerun: it deletes the old outputs before the step function runs."""


def _run_holding_lease(task: StepTask, lease: Lease, stop: StopSignal) -> StepResult | _Retry:
    """Everything this worker does while it holds the lease, in order; each status write is fenced by it.

    Raises LeaseLostError (having written nothing more) if the lease is lost on the way.
    """
    attempt = _record_start(task, lease)
    try:
        return _run_attempt(task, lease, stop, attempt)
    except LeaseLostError:
        raise
    except KeyboardInterrupt as interrupted:
        # Ctrl-C (Ray's cancel on a worker) can land outside the step function: after RUNNING, while the step log
        # and the heartbeat start (seen on a busy machine), which left the step RUNNING with its lease freed.
        # Recorded only if nothing was since this attempt's RUNNING: not over a SUCCESS, nor a second time.
        if _still_running(task, lease, attempt):
            _record_interrupt(task, lease, None, attempt, interrupted)
        raise
    except Exception as error:  # the executor's own writes failed (a full disk under the log or the manifest)
        return _record_failure(task, lease, None, attempt, error)


def _run_attempt(task: StepTask, lease: Lease, stop: StopSignal, attempt: _Attempt) -> StepResult | _Retry:
    """The step function under the heartbeat and the step log, then its outcome recorded."""
    with StepLog(task.output_path) as step_log:
        abandoned = threading.Event()

        def abandon() -> None:  # from the interrupting thread: the step's is blocked where no exception reaches
            try:
                beat.stop()
                _record_interrupt(task, lease, None, attempt, StepInterrupted(), ABANDONED)
                lease.release()
            finally:
                abandoned.set()

        interrupter = Interrupter(on_abandon=abandon)

        def stop_step(_lost: LeaseLostError) -> None:
            interrupter.interrupt(StepAborted)

        with Heartbeat(lease, on_lost=stop_step, on_tick=step_log.upload) as beat:
            error = _call_step_fn(task, stop, interrupter, attempt.starts_forced_run)
            if interrupter.abandoned:  # recorded and freed by the abandoner; this thread came back late
                abandoned.wait()
                return StepResult(Outcome.FAILED, ABANDONED)
            beat.raise_if_lost()
            if error is None:
                manifest = write_manifest(task.output_path)
                error = _pin_mismatch(task, manifest["digest"])
            if error is None:
                details = {"code_fingerprint": task.fingerprint, "output_digest": manifest["digest"]}
                success = StatusEvent(
                    StepStatus.SUCCESS, attempt=attempt.number, worker=lease.worker_id, details=details
                )
                _append_holding(task.output_path, lease, beat, success)
                logger.info("%s: SUCCESS %s", task.label, task.output_path)
                return StepResult(Outcome.SUCCEEDED)
            log_note = step_log.save_failure(error)
            if isinstance(error, (StepInterrupted, KeyboardInterrupt)):
                return _record_interrupt(task, lease, beat, attempt, error)
            return _record_failure(task, lease, beat, attempt, error, log_note)


def _pin_mismatch(task: StepTask, digest: str) -> PinError | None:
    if task.pinned_digest is None or digest == task.pinned_digest:
        return None
    return PinError(mismatch_message(task.label, task.output_path, digest, task.pinned_digest, task.pin_file))


def record_pin_mismatch(output_path: str, worker_id: str, settings: LeaseSettings, message: str) -> bool:
    """Record FAILED over a SUCCESS whose files no longer give the pinned digest (the output stays); True if
    written, False if a live holder has the step (it records its own outcome)."""
    lease = Lease(output_path, worker_id, settings)
    if not lease.try_acquire():
        return False
    try:
        _append_holding(output_path, lease, None, StatusEvent(StepStatus.FAILED, worker=worker_id, message=message))
        return True
    finally:
        lease.release()


def _still_running(task: StepTask, lease: Lease, attempt: _Attempt) -> bool:
    """Whether this attempt's RUNNING is still the step's last event (nothing recorded since it started); False
    if the history cannot be read (the interrupt goes on; the lease is freed and the next run takes over)."""
    try:
        events = read_events(task.output_path)
    except Exception:
        logger.warning("%s: could not read its status after an interrupt", task.label, exc_info=True)
        return False
    if not events or events[-1].status != StepStatus.RUNNING:
        return False
    return events[-1].attempt == attempt.number and events[-1].worker == lease.worker_id


def _record_start(task: StepTask, lease: Lease) -> _Attempt:
    """`.executor_info` and the RUNNING event; the first attempt of a forced run starts a new generation."""
    events = read_events(task.output_path)
    in_run = attempts_so_far(events, run=task.run_id) + 1
    attempt = _Attempt(attempts_so_far(events) + 1, in_run, starts_forced_run=task.force and in_run == 1)
    details: dict[str, Any] = {"run": task.run_id}
    if attempt.starts_forced_run:
        details["force_run"] = True  # sharded steps redo every shard committed before this attempt
    started = StatusEvent(
        StepStatus.RUNNING, attempt=attempt.number, worker=lease.worker_id, details=details, lease=lease.number
    )
    info = {**task.info, "worker": lease.worker_id, "started": started.time, "machine": this_cpu()}
    storage.write_json_atomic(info_path(task.output_path), info)
    append_event(task.output_path, started)
    logger.info("%s: RUNNING (attempt %d) %s", task.label, attempt.number, task.output_path)
    return attempt


def _call_step_fn(
    task: StepTask, stop: StopSignal, interrupter: Interrupter, clear_first: bool
) -> BaseException | None:
    """Run the step function; what it raised (or what interrupted it), or None if it returned.

    With `clear_first` (a forced rerun) the old outputs are deleted first, here: under the heartbeat (deleting
    10^5 shard files takes a while) and with a failure recorded and retried like the step's own."""
    try:
        with interrupter:
            stop.register(interrupter)
            try:
                if clear_first:
                    deleted = clear_outputs(task.output_path)
                    logger.info("%s: force_run: deleted the old outputs %s", task.label, ", ".join(deleted) or "(none)")
                storage.forget_listings(task.output_path, everything=True)
                with rare_collections():
                    task.fn(task.config)
            finally:
                stop.unregister(interrupter)
    except BaseException as error:  # every outcome is recorded by the caller
        return error
    return None


INTERRUPTED = "interrupted by the user"
ABANDONED = f"{INTERRUPTED} (the step function did not stop: blocked in a native call, its thread was left behind)"
WORKER_KILLED = f"{INTERRUPTED} (the step function did not stop: blocked in a native call, its Ray worker was killed)"


def record_worker_killed(task: StepTask, wait_s: float = 5.0) -> bool:
    """After Ctrl-C, FAILED `WORKER_KILLED` for a step whose worker process was killed while it held the step: the
    lease is taken over (its holder's pid is gone on this host) and freed. False, with nothing written, when the
    holder is on another host or still alive after `wait_s` (the lease then frees itself when it goes stale), or
    when the step finished meanwhile."""
    lease = Lease(task.output_path, f"{task.worker_id}/interrupt", task.lease_settings)
    deadline = time.monotonic() + wait_s
    while not lease.try_acquire():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    try:
        events = read_events(task.output_path)
        if not events or events[-1].status != StepStatus.RUNNING:
            return False  # it finished (or failed) before its worker died; that outcome stands
        _append_holding(task.output_path, lease, None,
                        StatusEvent(StepStatus.FAILED, attempt=events[-1].attempt, worker=lease.worker_id,
                                    message=WORKER_KILLED))  # fmt: skip
        return True
    finally:
        lease.release()


def _record_interrupt(
    task: StepTask,
    lease: Lease,
    beat: Heartbeat | None,
    attempt: _Attempt,
    interrupted: BaseException,
    message: str = INTERRUPTED,
) -> StepResult:
    """FAILED "interrupted by the user", so the next run starts at once (the lease is freed after)."""
    failed = StatusEvent(StepStatus.FAILED, attempt=attempt.number, worker=lease.worker_id, message=message)
    try:
        _append_holding(task.output_path, lease, beat, failed)
    except LeaseLostError:
        pass  # the step is someone else's now; they record its outcome
    if isinstance(interrupted, KeyboardInterrupt):
        raise interrupted
    return StepResult(Outcome.FAILED, message)


_STORAGE_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def _record_failure(
    task: StepTask,
    lease: Lease,
    beat: Heartbeat | None,
    attempt: _Attempt,
    error: BaseException,
    log_note: str | None = None,
) -> StepResult | _Retry:
    """FAILED with the traceback; or, for a retryable error with attempts left in this run, WAITING and a backoff."""
    message = f"{type(error).__name__}: {error}"
    for note in getattr(error, "__notes__", None) or ():  # e.g. which gang member raised it
        message += f" ({note})"
    if isinstance(error, OSError) and error.errno in _STORAGE_FULL_ERRNOS and not error.filename:
        message += f" (writing under {task.output_path})"  # a full disk's error names no file
    if log_note:
        message += f"; {log_note}"
    details = {"traceback": "".join(traceback.format_exception(error))}
    if task.retry.should_retry(error, attempt.in_run):
        wait_s = task.retry.backoff_s(attempt.in_run)
        kind = "transient" if is_transient(error) else "retryable"
        logger.warning(
            "%s: attempt %d failed (%s %s); retrying in %.1fs", task.label, attempt.number, kind, message, wait_s
        )
        note = f"attempt {attempt.number} failed ({kind}): {message}; retrying in {wait_s:.1f}s"
        waiting = StatusEvent(
            StepStatus.WAITING, attempt=attempt.number, worker=lease.worker_id, message=note, details=details
        )
        _append_holding(task.output_path, lease, beat, waiting)
        return _Retry(wait_s)
    logger.error("%s: FAILED (attempt %d): %s", task.label, attempt.number, message)
    failed = StatusEvent(
        StepStatus.FAILED, attempt=attempt.number, worker=lease.worker_id, message=message, details=details
    )
    _append_holding(task.output_path, lease, beat, failed)
    return StepResult(Outcome.FAILED, message)


def _append_holding(output_path: str, lease: Lease, beat: Heartbeat | None, event: StatusEvent) -> None:
    """Append `event` only while this worker holds the lease: its heartbeat alive, its number the newest,
    and no event of a newer lease in the history (append_event's fence). Else LeaseLostError."""
    if beat is not None:
        beat.raise_if_lost()
    lease.check()
    append_event(output_path, dataclasses.replace(event, lease=lease.number))


def record_dep_failed(output_path: str, worker_id: str, settings: LeaseSettings, message: str) -> bool:
    """Record DEP_FAILED for a step that will not run, unless it is SUCCESS or a live holder has it.

    True if written. A holder of the step's lease records its own outcome; a SUCCESS written by another
    executor meanwhile stands.
    """
    lease = Lease(output_path, worker_id, settings)
    if not lease.try_acquire():
        return False
    try:
        events = read_events(output_path)
        if events and events[-1].status == StepStatus.SUCCESS:
            return False
        _append_holding(output_path, lease, None, StatusEvent(StepStatus.DEP_FAILED, worker=worker_id, message=message))
        return True
    finally:
        lease.release()
