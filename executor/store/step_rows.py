"""The one model of a step's state, read from its `.executor_status`, and the listings built from it.

`StepState` is what the command line's `status`, `explain`, the dashboard and the public site all show of a step:
its status, attempts, times, worker, message, the digest its SUCCESS committed and the code fingerprint it
recorded. Code drift is decided here and nowhere else (`StepState.drifted`): the fingerprint a step's SUCCESS
recorded differs from the one the newest experiment that planned it recorded (the command line cannot import
the user's code; the newest run of it is the best word on what the code is now). A step that is not SUCCESS now
has no output to drift from.

A history that cannot be parsed is the state CORRUPT, its message the parser's (executor/store/events.py): the
path and what to do. Every read here is batched (`storage.read_many`), so a view of thousands of steps costs a
few parallel round trips, not one sequential round trip per step.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from executor.errors import StorageError
from executor.store import storage
from executor.store.events import StatusEvent, StepStatus, attempts_so_far, committed_digest, parse_events, parse_time
from executor.store.layout import INFO_FILE, PROGRESS_FILE, STATUS_FILE
from executor.store.lease import LeaseSettings, holder_lost_note

CORRUPT = "CORRUPT"
"""The state of a step whose `.executor_status` cannot be parsed."""
TERMINAL = frozenset({StepStatus.SUCCESS, StepStatus.FAILED, StepStatus.DEP_FAILED})


def code_drifted(recorded: str | None, current: str | None) -> bool:
    """Whether the code changed since an output was written: both fingerprints known, and different."""
    return bool(recorded and current and recorded != current)


@dataclass(frozen=True)
class StepState:
    """What a step's `.executor_status` says now."""

    status: str | None
    """WAITING, RUNNING, SUCCESS, FAILED, DEP_FAILED, CORRUPT, or None (never ran)."""
    attempts: int = 0
    started: str | None = None
    """Time of the last RUNNING event."""
    finished: str | None = None
    """Time of the last event when it is SUCCESS, FAILED or DEP_FAILED."""
    updated: str | None = None
    """Time of the last event."""
    worker: str | None = None
    message: str | None = None
    recorded_fingerprint: str | None = None
    """The code fingerprint its SUCCESS recorded; None unless it is SUCCESS now."""
    digest: str | None = None
    """The output digest its SUCCESS recorded (sha256 of the canonical manifest); None unless it is SUCCESS now."""
    started_ts: float | None = None
    finished_ts: float | None = None
    """`started` and `finished` as POSIX seconds, parsed once (a table of 10,000 rows sorts by duration)."""

    @staticmethod
    def of(events: Sequence[StatusEvent]) -> StepState:
        if not events:
            return StepState(status=None)
        last = events[-1]
        running = [event for event in events if event.status == StepStatus.RUNNING]
        success = last.status == StepStatus.SUCCESS
        started = running[-1].time if running else None
        finished = last.time if last.status in TERMINAL else None
        return StepState(
            status=str(last.status),
            attempts=attempts_so_far(events),
            started=started,
            finished=finished,
            updated=last.time,
            worker=last.worker,
            message=last.message,
            recorded_fingerprint=last.details.get("code_fingerprint") if success else None,
            digest=committed_digest(events),
            started_ts=parse_time(started).timestamp() if started else None,
            finished_ts=parse_time(finished).timestamp() if finished else None,
        )

    @staticmethod
    def read(blob: bytes | None, output_path: str) -> StepState:
        """The state of a `.executor_status`'s bytes (None: the step never ran)."""
        try:
            return StepState.of(parse_events(blob, output_path))
        except StorageError as error:
            return StepState(status=CORRUPT, message=str(error))

    def drifted(self, current_fingerprint: str | None) -> bool:
        """Whether the code changed since this step's SUCCESS wrote its output (see the module docstring)."""
        return code_drifted(self.recorded_fingerprint, current_fingerprint)

    def duration_s(self, now: float) -> float | None:
        """Seconds from the last start to its end (or to `now` while it runs); None before a start or while WAITING."""
        if self.started_ts is None or self.status == StepStatus.WAITING:
            return None
        end = self.finished_ts if self.finished_ts is not None else now
        return max(0.0, end - self.started_ts)


@dataclass(frozen=True)
class StepRow:
    """A step of a listing (`python -m executor status`): where it is, its state, and what only a running step has."""

    name: str
    label: str
    output_path: str
    state: StepState
    drift: bool = False
    """`state.drifted` against the fingerprint the newest experiment planning it recorded."""
    progress: dict[str, Any] | None = None
    """Shard progress of a RUNNING sharded step (`.executor_progress`)."""
    holder_lost: str | None = None
    """For a RUNNING step whose lease holder is gone: "holder lost since T; the next run takes it over"."""

    @property
    def status(self) -> str | None:
        return self.state.status

    @property
    def shown_status(self) -> str:
        """The status as `status` prints it: RUNNING says when nothing is running it any more."""
        status = self.status or "never ran"
        return f"{status} - {self.holder_lost}" if self.holder_lost else status


def step_row(name: str, output_path: str, blob: bytes | None, current_fingerprint: str | None = None) -> StepRow:
    state = StepState.read(blob, output_path)
    return StepRow(name, storage.basename(output_path), output_path, state, state.drifted(current_fingerprint))


def with_progress(rows: list[StepRow]) -> list[StepRow]:
    """Attach shard progress (one batched read) and whether the holder is lost to the RUNNING rows."""
    running = [index for index, row in enumerate(rows) if row.status == StepStatus.RUNNING]
    blobs = storage.read_many(storage.join(rows[index].output_path, PROGRESS_FILE) for index in running)
    rows = list(rows)
    settings = LeaseSettings.from_env()
    for index, blob in zip(running, blobs, strict=True):
        lost = holder_lost_note(rows[index].output_path, rows[index].state.started, settings)
        progress = json.loads(blob) if blob is not None else None
        rows[index] = dataclasses.replace(rows[index], progress=progress, holder_lost=lost)
    return rows


def experiment_rows(record: dict[str, Any]) -> list[StepRow]:
    steps = record["steps"]
    blobs = storage.read_many(step["status_path"] for step in steps)
    rows = [
        step_row(step["name"], step["output_path"], blob, step.get("code_fingerprint"))
        for step, blob in zip(steps, blobs, strict=True)
    ]
    return with_progress(rows)


def find_step_outputs(prefix: str, max_depth: int = 3) -> list[str]:
    """Output folders under `prefix` (step names may contain '/', so look a few levels down)."""
    fs, fs_path = storage.filesystem(prefix)
    base = fs_path.rstrip("/")
    found: list[str] = []
    for depth in range(1, max_depth + 1):
        pattern = base + "/*" * depth + "/" + INFO_FILE
        for match in fs.glob(pattern):
            folder = match[: -len(INFO_FILE) - 1]
            found.append(storage.join(prefix, folder[len(base) :]))
    return sorted(set(found))


def prefix_rows(prefix: str, fingerprints: dict[str, str] | None = None) -> list[StepRow]:
    """A row per step output under `prefix`; `fingerprints` (output path -> the code's current fingerprint,
    see `experiments.current_fingerprints`) lets the rows tell code drift."""
    fingerprints = fingerprints or {}
    outputs = find_step_outputs(prefix)
    infos = storage.read_many(storage.join(path, INFO_FILE) for path in outputs)
    statuses = storage.read_many(storage.join(path, STATUS_FILE) for path in outputs)
    rows = []
    for path, info_blob, status_blob in zip(outputs, infos, statuses, strict=True):
        name = json.loads(info_blob).get("name") if info_blob else storage.basename(path)
        rows.append(step_row(name, path, status_blob, fingerprints.get(path)))
    return with_progress(rows)


def status_counts(rows: list[StepRow]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        key = row.status or "NEVER_RAN"
        counts[key] = counts.get(key, 0) + 1
    return counts
