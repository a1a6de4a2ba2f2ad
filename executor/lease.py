"""Exactly-once ownership of a step, built only on exclusive create.

A lease is a numbered object `<output>/.executor_lease/<n>.json` holding the worker id and a
heartbeat time. The highest number is the current lease. To acquire:

- no lease yet: exclusively create number 0;
- the current one is released, or its heartbeat is older than `stale_s`: exclusively create n + 1;
- the current one is fresh and someone else's: wait (the caller polls).

Exactly one of many racing workers wins each exclusive create. Only the holder ever rewrites its
own object (to renew the heartbeat or mark it released), and before each renewal it checks that
no higher number exists: a worker whose lease was taken over learns so at its next heartbeat and
aborts. No compare-and-swap is needed, so this works on local files, GCS and S3 alike.

Staleness compares the writer's clock with the reader's; clusters keep clocks within seconds,
far below the 90 s default.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from executor import storage
from executor.errors import LeaseLostError
from executor.status import LEASE_DIR, now_iso, parse_time

logger = logging.getLogger(__name__)

HEARTBEAT_ENV = "EXECUTOR_LEASE_HEARTBEAT_S"
STALE_ENV = "EXECUTOR_LEASE_STALE_S"


@dataclass(frozen=True)
class LeaseSettings:
    heartbeat_s: float = 30.0
    """How often a holder renews its lease."""
    stale_s: float = 90.0
    """A lease whose heartbeat is older than this may be taken over."""

    @staticmethod
    def from_env() -> LeaseSettings:
        defaults = LeaseSettings()
        heartbeat = _env_seconds(HEARTBEAT_ENV, defaults.heartbeat_s)
        stale = _env_seconds(STALE_ENV, defaults.stale_s)
        if stale <= heartbeat:
            raise ValueError(
                f"{STALE_ENV}={stale} must be larger than {HEARTBEAT_ENV}={heartbeat}, "
                "or live leases would be taken over"
            )
        return LeaseSettings(heartbeat, stale)

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


def _lease_name(number: int) -> str:
    return f"{number:010d}.json"


class Lease:
    """One worker's claim on one step's output path."""

    def __init__(self, output_path: str, worker_id: str, settings: LeaseSettings):
        self.output_path = output_path
        self.worker_id = worker_id
        self.settings = settings
        self.number: int | None = None
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

    def try_acquire(self) -> bool:
        """Take the lease if it is free or stale. False if another worker holds a fresh one."""
        numbers = self._numbers()
        if numbers:
            top = numbers[-1]
            record = storage.read_json(self._path(top))
            if record is None:  # removed between listing and reading: look again next poll
                return False
            if not record.get("released") and not self.is_stale(record):
                return record.get("worker") == self.worker_id and self.number == top
            if not record.get("released"):
                logger.warning(
                    "%s: taking over the stale lease of %s (last heartbeat %s)",
                    self.output_path,
                    record.get("worker"),
                    record.get("heartbeat"),
                )
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
        if self.number is None:
            return
        try:
            self.check()
            storage.write_atomic(self._path(self.number), self._record(released=True))
        except LeaseLostError:
            pass  # someone else holds it now; their lease is theirs to release
        finally:
            self.number = None


class Heartbeat:
    """Renews a held lease in a background thread; calls `on_lost` once if it is taken over."""

    def __init__(
        self, lease: Lease, on_lost: Callable[[LeaseLostError], None], on_tick: Callable[[], None] | None = None
    ):
        self.lease = lease
        self.on_lost = on_lost
        self.on_tick = on_tick
        self.lost: LeaseLostError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat:{lease.output_path}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.lease.settings.heartbeat_s):
            try:
                self.lease.renew()
            except LeaseLostError as error:
                self.lost = error
                logger.error("%s", error)
                self.on_lost(error)
                return
            except OSError as error:  # a storage hiccup: the next beat may succeed
                logger.warning("%s: heartbeat failed (%s); retrying", self.lease.output_path, error)
            if self.on_tick is not None:
                self.on_tick()
