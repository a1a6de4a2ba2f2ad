"""A step's `.executor_status`: the one parser and writer of its event history (the file names: layout.py).

Only a lease holder rewrites `.executor_status`; before any lease exists, the first WAITING event is
created with an exclusive create, so no writer can overwrite another's newer history. Each event a
holder writes carries its lease number, and `append_event` refuses an event whose lease is older
than one already in the history: a holder that was taken over cannot write after its successor.
(Without compare-and-swap this fences every write that starts after the successor's first event
landed; the holder's own heartbeat deadline, see lease.py, closes the rest of the window.)

Attempts are numbered across runs (the n-th RUNNING event is attempt n). A RUNNING event also
records which executor run made it (`details["run"]`), so each run can give a step its full retry
budget, and whether it starts a forced rerun (`details["force_run"]`), which sharded steps use to
tell the forced run's shards from older ones.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from executor.errors import LeaseLostError, StorageError
from executor.store import storage
from executor.store.layout import STATUS_FILE

logger = logging.getLogger(__name__)


class StepStatus(StrEnum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    DEP_FAILED = "DEP_FAILED"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def parse_time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


@dataclass(frozen=True)
class StatusEvent:
    status: StepStatus
    time: str = field(default_factory=now_iso)
    attempt: int = 0
    worker: str | None = None
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    """Extra figures: the code fingerprint on SUCCESS, shard progress, the traceback on FAILED."""
    lease: int | None = None
    """The writer's lease number (None: written without a lease, e.g. the first WAITING)."""

    def to_json(self) -> str:
        record = dataclasses.asdict(self)
        record["status"] = str(self.status)
        for optional in ("details", "lease"):
            if record[optional] in ({}, None):
                del record[optional]
        return json.dumps(record, sort_keys=True, default=str)

    @staticmethod
    def from_json(line: str) -> StatusEvent:
        record = json.loads(line)
        return StatusEvent(
            status=StepStatus(record["status"]),
            time=record["time"],
            attempt=record.get("attempt", 0),
            worker=record.get("worker"),
            message=record.get("message"),
            details=record.get("details") or {},
            lease=record.get("lease"),
        )


def status_path(output_path: str) -> str:
    return storage.join(output_path, STATUS_FILE)


def parse_events(data: bytes | None, output_path: str) -> list[StatusEvent]:
    if not data:
        return []
    try:
        return [StatusEvent.from_json(line) for line in data.decode().splitlines() if line.strip()]
    except (ValueError, KeyError) as error:
        raise StorageError(
            f"{status_path(output_path)} is corrupt ({error}); inspect it, then delete it to let the step rerun"
        ) from error


def read_events(output_path: str) -> list[StatusEvent]:
    return parse_events(storage.read_bytes(status_path(output_path)), output_path)


def read_status(output_path: str) -> str | None:
    """The step's current status (WAITING, RUNNING, SUCCESS, FAILED, DEP_FAILED), or None if it never ran."""
    events = read_events(output_path)
    return str(events[-1].status) if events else None


def read_many_events(output_paths: Sequence[str]) -> list[list[StatusEvent]]:
    """Status histories of many steps, read in parallel."""
    blobs = storage.read_many(status_path(path) for path in output_paths)
    return [parse_events(blob, path) for blob, path in zip(blobs, output_paths, strict=True)]


def create_initial_status(output_path: str, event: StatusEvent) -> bool:
    """Start a history with `event` if the step has none yet (safe without a lease)."""
    return storage.create_exclusive(status_path(output_path), event.to_json() + "\n")


def append_event(output_path: str, event: StatusEvent) -> None:
    """Append to the history. Only the lease holder may call this (read, then atomic rewrite).

    Raises LeaseLostError, writing nothing, if the history holds an event of a newer lease.
    """
    path = status_path(output_path)
    existing = storage.read_bytes(path) or b""
    if event.lease is not None:
        newest = max((e.lease for e in parse_events(existing, output_path) if e.lease is not None), default=-1)
        if newest > event.lease:
            raise LeaseLostError(
                f"{output_path}: refused to record {event.status} of lease {event.lease}: "
                f"lease {newest} has taken the step over"
            )
    if existing and not existing.endswith(b"\n"):
        existing += b"\n"
    storage.write_atomic(path, existing + event.to_json().encode() + b"\n")
    logger.debug("%s: %s", output_path, event.status)


def committed_digest(events: Sequence[StatusEvent]) -> str | None:
    """The output digest (sha256 of the canonical manifest, records.output_digest) the step's SUCCESS recorded;
    None if it is not SUCCESS now, or finished before digests were recorded."""
    if not events or events[-1].status != StepStatus.SUCCESS:
        return None
    return events[-1].details.get("output_digest")


def attempts_so_far(events: Sequence[StatusEvent], run: str | None = None) -> int:
    """RUNNING events in the history; only those of executor run `run` if it is given."""
    return sum(
        1 for event in events if event.status == StepStatus.RUNNING and (run is None or event.details.get("run") == run)
    )


def forced_generation(events: Sequence[StatusEvent]) -> int | None:
    """The attempt that started the latest forced rerun, or None if the step was never forced.

    Everything a sharded step committed before that attempt belongs to the output being replaced.
    """
    starts = [event.attempt for event in events if event.status == StepStatus.RUNNING and "force_run" in event.details]
    return starts[-1] if starts else None
