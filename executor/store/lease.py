"""Exactly-once ownership of a step, built only on exclusive create.

A lease is a numbered object `<output>/.executor_lease/<n>.json` holding the worker id and a
heartbeat time. The highest number is the current lease. To acquire:

- no lease yet: exclusively create number 0;
- the current one is released, or its heartbeat is older than `stale_s`: exclusively create n + 1;
- the current one is fresh and someone else's: wait (the caller polls);
- the current one is fresh but its holder was a process on this machine that no longer exists
  (killed, OOM-killed): exclusively create n + 1 at once, without waiting for staleness.

Exactly one of many racing workers wins each exclusive create. Only the holder ever rewrites its
own object (to renew the heartbeat or mark it released), and before each renewal it checks that
no higher number exists: a worker whose lease was taken over learns so at its next heartbeat and
aborts. No compare-and-swap is needed, so this works on local files, GCS and S3 alike.

A holder that cannot renew (storage down, credentials gone, any exception at all) keeps trying,
and once its last good renewal is older than `renew_deadline_s` (half the stale interval) it
declares the lease lost and stops its step: it stops before anyone may take the lease over, so
two writers never share an output folder. A watchdog thread enforces that deadline, so even a
renewal stuck in a storage call's retries cannot hold it back.

Staleness compares the writer's clock with the reader's; clusters keep clocks within seconds,
far below the 90 s default and the 45 s margin the deadline leaves.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from executor.errors import LeaseLostError
from executor.store import storage
from executor.store.events import now_iso, parse_time
from executor.store.layout import LEASE_DIR
from executor.store.processes import is_running, start_ticks

logger = logging.getLogger(__name__)

HEARTBEAT_ENV = "EXECUTOR_LEASE_HEARTBEAT_S"
STALE_ENV = "EXECUTOR_LEASE_STALE_S"


@dataclass(frozen=True)
class LeaseSettings:
    heartbeat_s: float = 15.0
    """How often a holder renews its lease: three tries inside `renew_deadline_s`, so that one renewal slowed by a
    busy machine or store (a worker given a few percent of a core took over 15 s) does not stop a running step."""
    stale_s: float = 90.0
    """A lease whose heartbeat is older than this may be taken over."""

    @staticmethod
    def from_env() -> LeaseSettings:
        defaults = LeaseSettings()
        heartbeat = _env_seconds(HEARTBEAT_ENV, defaults.heartbeat_s)
        stale = _env_seconds(STALE_ENV, defaults.stale_s)
        if stale <= 2 * heartbeat:
            raise ValueError(
                f"{STALE_ENV}={stale} must be more than twice {HEARTBEAT_ENV}={heartbeat}: a holder gives "
                "its lease up when it could not renew for half the stale interval, and needs a retry before that"
            )
        return LeaseSettings(heartbeat, stale)

    @property
    def renew_deadline_s(self) -> float:
        """A holder whose last good renewal is older than this stops its step (the other half is margin)."""
        return self.stale_s / 2

    @property
    def poll_s(self) -> float:
        """How often a waiting worker looks again."""
        return max(0.05, min(self.heartbeat_s, 5.0))


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as error:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from error
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return value


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@cache
def this_host() -> str:
    """This machine and process namespace: the hostname, plus the boot id and the pid namespace where
    Linux has them, so two containers that share a hostname never mistake each other's processes."""
    parts = [socket.gethostname()]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        pass  # not Linux: the hostname alone
    return "|".join(parts)


def holder_is_gone(record: dict) -> bool:
    """True if the lease's holder was a process on this machine that no longer runs (its pid with its start time,
    where the record has one: a later process given the same pid is not the holder; executor/store/processes.py)."""
    pid, started = record.get("pid"), record.get("started")
    return (record.get("host") == this_host() and isinstance(pid, int)
            and not is_running(pid, started if isinstance(started, int) else None))  # fmt: skip


def _lease_name(number: int) -> str:
    return f"{number:010d}.json"


class Lease:
    """One worker's claim on one step's output path."""

    def __init__(self, output_path: str, worker_id: str, settings: LeaseSettings):
        self.output_path = output_path
        self.worker_id = worker_id
        self.settings = settings
        self.number: int | None = None
        self.took_over = False
        """Whether this worker ever acquired the lease from a holder that was gone (not one that released it)."""
        self._acquired_at: str | None = None
        self._directory = storage.join(output_path, LEASE_DIR)

    def _path(self, number: int) -> str:
        return storage.join(self._directory, _lease_name(number))

    def _numbers(self) -> list[int]:
        numbers = []
        for name in storage.list_names(self._directory):
            stem = name.removesuffix(".json")
            if name.endswith(".json") and stem.isdigit():
                numbers.append(int(stem))
        return sorted(numbers)

    def _record(self, *, released: bool = False) -> bytes:
        return json.dumps(
            {
                "worker": self.worker_id,
                "number": self.number,
                "acquired": self._acquired_at,
                "heartbeat": now_iso(),
                "released": released,
                "host": this_host(),
                "pid": os.getpid(),
                "started": start_ticks(os.getpid()),
            }
        ).encode()

    def current(self) -> dict | None:
        """The current (highest-numbered) lease record, or None if there is none."""
        numbers = self._numbers()
        if not numbers:
            return None
        record = storage.read_json(self._path(numbers[-1]))
        if record is not None:
            record.setdefault("number", numbers[-1])
        return record

    def is_stale(self, record: dict) -> bool:
        heartbeat = parse_time(record["heartbeat"])
        age = (parse_time(now_iso()) - heartbeat).total_seconds()
        return age > self.settings.stale_s

    def takeover_reason(self, record: dict) -> str | None:
        """Why `record`'s lease may be taken now ("released", "stale", a dead holder), or None if it is live."""
        if record.get("released"):
            return "released"
        if self.is_stale(record):
            return f"stale (last heartbeat {record.get('heartbeat')})"
        if holder_is_gone(record):
            return f"its holder process {record.get('pid')} on this host is gone"
        return None

    def try_acquire(self) -> bool:
        """Take the lease if it is free, stale or its local holder died. False if another worker holds it."""
        numbers = self._numbers()
        taking_over = False
        if numbers:
            top = numbers[-1]
            record = storage.read_json(self._path(top))
            if record is None:  # removed between listing and reading: look again next poll
                return False
            reason = self.takeover_reason(record)
            if reason is None:
                return record.get("worker") == self.worker_id and self.number == top
            if reason != "released":
                logger.warning("%s: taking over the lease of %s: %s", self.output_path, record.get("worker"), reason)
                taking_over = True
            candidate = top + 1
        else:
            candidate = 0
        self.number = candidate
        self._acquired_at = now_iso()
        if not storage.create_exclusive(self._path(candidate), self._record()) and not self._created_by_us(candidate):
            self.number = None
            return False
        if self._numbers()[-1] != candidate:
            # We recreated a number an earlier holder had already cleaned up; a higher one exists.
            storage.write_atomic(self._path(candidate), self._record(released=True))
            self.number = None
            return False
        for older in (number for number in numbers if number < candidate):
            storage.delete(self._path(older))
        self.took_over = self.took_over or taking_over
        return True

    def _created_by_us(self, number: int) -> bool:
        """After a lost answer to a retried create, the object may be ours after all."""
        record = storage.read_json(self._path(number)) or {}
        return record.get("worker") == self.worker_id and record.get("acquired") == self._acquired_at

    def check(self) -> None:
        """Raise LeaseLostError unless this worker still holds the current lease."""
        if self.number is None:
            raise LeaseLostError(f"{self.output_path}: this worker holds no lease")
        numbers = self._numbers()
        if not numbers or numbers[-1] != self.number:
            raise LeaseLostError(
                f"{self.output_path}: lease {self.number} of {self.worker_id} was taken over "
                f"(current: {numbers[-1] if numbers else 'none'})"
            )

    def renew(self) -> None:
        self.check()
        assert self.number is not None
        storage.write_atomic(self._path(self.number), self._record())

    def release(self) -> None:
        """Mark the lease released, if still ours. Never raises: an unreleased lease goes stale anyway."""
        if self.number is None:
            return
        try:
            self.check()
            storage.write_atomic(self._path(self.number), self._record(released=True))
        except LeaseLostError:
            pass  # someone else holds it now; their lease is theirs to release
        except Exception as error:  # storage trouble: the lease frees itself when it goes stale
            logger.warning("%s: could not release lease %s (%r); it goes stale in %.0fs",
                           self.output_path, self.number, error, self.settings.stale_s)  # fmt: skip
        finally:
            self.number = None


HOLDER_LOST = "holder lost since {since}; the next run takes it over"
"""What `status`, `explain` and the dashboard add to RUNNING when no live holder is behind it."""


def holder_lost_note(output_path: str, running_since: str | None, settings: LeaseSettings | None = None) -> str | None:
    """For a step recorded RUNNING: `HOLDER_LOST` with its lease's last heartbeat when the holder is gone (the
    heartbeat older than the stale interval, its process on this host dead, or the lease released without a
    final status; `running_since` when there is no lease at all), or None while a live holder renews it. A
    killed run leaves RUNNING behind; this is how a reader tells it from a run that is going on."""
    observer = Lease(output_path, "observer", settings or LeaseSettings.from_env())
    record = observer.current()
    if record is None:
        return HOLDER_LOST.format(since=running_since or "an unknown time")
    if observer.takeover_reason(record) is None:
        return None
    return HOLDER_LOST.format(since=record.get("heartbeat") or running_since or "an unknown time")


def last_heartbeat(output_path: str, number: int) -> str | None:
    """Lease `number`'s last heartbeat (None: no such lease): when a holder lost, and taken over, was last seen."""
    return (storage.read_json(storage.join(output_path, LEASE_DIR, _lease_name(number))) or {}).get("heartbeat")


def takeover_reason(output_path: str, settings: LeaseSettings) -> str | None:
    """For a step recorded RUNNING: why its lease may be taken over now, or None while its holder is live."""
    observer = Lease(output_path, "observer", settings)
    record = observer.current()
    return "no lease" if record is None else observer.takeover_reason(record)


class Heartbeat:
    """Renews a held lease in the background; calls `on_lost` once if the lease is lost.

    The lease is lost when another worker took it over, or when no renewal has succeeded for
    `renew_deadline_s`, whatever the reason (renewals that raise, or one that hangs). Every failure
    of a renewal or of `on_tick` (the step log upload) is logged, and the next beat tries again.
    """

    def __init__(
        self, lease: Lease, on_lost: Callable[[LeaseLostError], None], on_tick: Callable[[], None] | None = None
    ):
        self.lease = lease
        self.on_lost = on_lost
        self.on_tick = on_tick
        self.lost: LeaseLostError | None = None
        self._stop = threading.Event()
        self._lost_lock = threading.Lock()
        self._renewed_at = time.monotonic()
        self._last_error: BaseException | None = None
        name = lease.output_path
        # Renewals run in this thread itself (a hand-off to a pool would slow them under a busy GIL); a
        # watchdog enforces the deadline even while a renewal hangs in storage retries; ticks (the log
        # upload) run apart so that a slow upload never delays a renewal.
        self._threads = [
            threading.Thread(target=self._renew_loop, name=f"heartbeat:{name}", daemon=True),
            threading.Thread(target=self._watchdog, name=f"lease-watchdog:{name}", daemon=True),
        ]
        self._ticks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-tick")
        self._tick: Future[None] | None = None

    def __enter__(self) -> Heartbeat:
        self._renewed_at = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()  # a renewal in flight lands first: the caller's release is the last write
        self._ticks.shutdown(wait=True, cancel_futures=True)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop renewing from another thread than the holder's (a step given up on, see
        executor/run/interrupts.py): a renewal in flight gets `timeout_s` to land, a tick in flight is not waited on."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout_s)
        self._ticks.shutdown(wait=False, cancel_futures=True)

    def raise_if_lost(self) -> None:
        if self.lost is not None:
            raise self.lost

    def _renew_loop(self) -> None:
        settings = self.lease.settings
        next_beat_s = settings.heartbeat_s
        while not self._stop.wait(next_beat_s) and self.lost is None:
            started = time.monotonic()
            try:
                self.lease.renew()
            except LeaseLostError as error:
                self._lose(error)
                return
            except Exception as error:  # any storage or client error: logged, retried, bounded by the watchdog
                self._last_error = error
                logger.warning("%s: heartbeat failed (%r); retrying", self.lease.output_path, error)
                # Try again soon enough that the deadline is met by a retry, not a whole beat after it.
                next_beat_s = min(settings.heartbeat_s, settings.renew_deadline_s / 4)
                continue
            self._renewed_at, next_beat_s = started, settings.heartbeat_s
            self._start_tick()

    def _watchdog(self) -> None:
        deadline_s = self.lease.settings.renew_deadline_s
        while self.lost is None:
            failing_s = time.monotonic() - self._renewed_at
            if failing_s >= deadline_s:
                self._lose(LeaseLostError(
                    f"{self.lease.output_path}: could not renew lease {self.lease.number} for {failing_s:.1f}s "
                    f"(last error: {self._last_error!r}); stopping before it can go stale and be taken over"
                ))  # fmt: skip
                return
            if self._stop.wait(deadline_s - failing_s):
                return

    def _start_tick(self) -> None:
        if self.on_tick is None or (self._tick is not None and not self._tick.done()):
            return  # the previous tick is still running: skip this one
        self._tick = self._ticks.submit(self.on_tick)
        self._tick.add_done_callback(self._log_tick_failure)

    def _log_tick_failure(self, tick: Future[None]) -> None:
        error = tick.exception() if not tick.cancelled() else None
        if error is not None:
            logger.warning("%s: heartbeat tick failed (%r); it runs again on the next beat",
                           self.lease.output_path, error)  # fmt: skip

    def _lose(self, error: LeaseLostError) -> None:
        with self._lost_lock:
            if self.lost is not None:
                return
            self.lost = error
        logger.error("%s", error)
        self.on_lost(error)
