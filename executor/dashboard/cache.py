"""A read-through cache of step status, shard progress and figures, shared by every request.

The dashboard is polled by many browser tabs for months, over DAGs of 10,000 steps on object
stores where each read is a round trip. So reads are batched (`storage.read_many`) and cached:

- a step whose last event is SUCCESS is finished: its status, progress and stats do not change
  (only a deliberate `--force_run` rewrites them), so they are re-read at most every
  `finished_ttl_s` (default five minutes);
- every other step (RUNNING, WAITING, FAILED, DEP_FAILED, never ran) may change at any moment,
  and is re-read when its cached copy is older than `live_ttl_s` (default one second).

Status files are read for all steps of a view (counts and graph colours need them); the larger
progress and stats files are read only for the rows a page actually shows, and for running steps.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from executor import storage
from executor.errors import StorageError
from executor.status import PROGRESS_FILE, STATS_FILE, STATUS_FILE, StepStatus, parse_events, parse_time

logger = logging.getLogger(__name__)

TERMINAL = {"SUCCESS", "FAILED", "DEP_FAILED"}


@dataclass(frozen=True)
class StepState:
    """What a step's `.executor_status` says now, in the form the views need."""

    status: str | None
    """WAITING, RUNNING, SUCCESS, FAILED, DEP_FAILED, CORRUPT, or None (never ran)."""
    attempts: int = 0
    started: str | None = None
    """Time of the last RUNNING event."""
    finished: str | None = None
    """Time of the last event when it is SUCCESS, FAILED or DEP_FAILED."""
    worker: str | None = None
    message: str | None = None
    recorded_fingerprint: str | None = None
    """The code fingerprint written with SUCCESS (for the drift warning)."""
    started_ts: float | None = None
    finished_ts: float | None = None

    def duration_s(self, now: float) -> float | None:
        if self.started_ts is None:
            return None
        end = self.finished_ts if self.finished_ts is not None else now
        return max(0.0, end - self.started_ts) if self.status != "WAITING" else None


def state_from_status_file(blob: bytes | None, output_path: str) -> StepState:
    try:
        events = parse_events(blob, output_path)
    except StorageError as error:
        return StepState(status="CORRUPT", message=str(error))
    if not events:
        return StepState(status=None)
    last = events[-1]
    running = [event for event in events if event.status == StepStatus.RUNNING]
    started = running[-1].time if running else None
    finished = last.time if str(last.status) in TERMINAL else None
    return StepState(
        status=str(last.status),
        attempts=len(running),
        started=started,
        finished=finished,
        worker=last.worker,
        message=last.message,
        recorded_fingerprint=last.details.get("code_fingerprint") if last.status == StepStatus.SUCCESS else None,
        started_ts=parse_time(started).timestamp() if started else None,
        finished_ts=parse_time(finished).timestamp() if finished else None,
    )


@dataclass
class StepExtras:
    """A step's `.executor_progress` and `stats.json` (either may be missing)."""

    progress: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None


@dataclass
class _Entry:
    value: Any
    fetched: float
    finished: bool


def _json_or_none(blob: bytes | None) -> dict[str, Any] | None:
    if not blob:
        return None
    try:
        value = json.loads(blob)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class StatusCache:
    live_ttl_s: float = 1.0
    finished_ttl_s: float = 300.0
    _states: dict[str, _Entry] = field(default_factory=dict)
    _extras: dict[str, _Entry] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _refresh_lock: threading.Lock = field(default_factory=threading.Lock)

    def _stale(self, table: dict[str, _Entry], paths: Sequence[str], now: float) -> list[str]:
        stale = []
        with self._lock:
            for path in paths:
                entry = table.get(path)
                ttl = self.finished_ttl_s if entry is not None and entry.finished else self.live_ttl_s
                if entry is None or now - entry.fetched > ttl:
                    stale.append(path)
        return stale

    def states(self, output_paths: Sequence[str]) -> list[StepState]:
        """The current state of each step, reading only what is missing or stale (one batch)."""
        with self._refresh_lock:  # one refresh at a time: concurrent polls share its result
            now = time.monotonic()
            stale = self._stale(self._states, output_paths, now)
            if stale:
                blobs = storage.read_many(storage.join(path, STATUS_FILE) for path in stale)
                fresh = [state_from_status_file(blob, path) for blob, path in zip(blobs, stale, strict=True)]
                with self._lock:
                    for path, state in zip(stale, fresh, strict=True):
                        self._states[path] = _Entry(state, now, state.status == "SUCCESS")
        with self._lock:
            return [self._states[path].value for path in output_paths]

    def extras(self, output_paths: Sequence[str], states: Sequence[StepState]) -> list[StepExtras]:
        """Progress and stats of a few steps (a page of rows); finished steps' copies are kept."""
        now = time.monotonic()
        stale = self._stale(self._extras, output_paths, now)
        if stale:
            finished = {path for path, state in zip(output_paths, states, strict=True) if state.status == "SUCCESS"}
            paths = [storage.join(path, name) for path in stale for name in (PROGRESS_FILE, STATS_FILE)]
            blobs = storage.read_many(paths)
            with self._lock:
                for index, path in enumerate(stale):
                    value = StepExtras(_json_or_none(blobs[2 * index]), _json_or_none(blobs[2 * index + 1]))
                    self._extras[path] = _Entry(value, now, path in finished)
        with self._lock:
            return [self._extras[path].value for path in output_paths]

    def forget(self, output_path: str) -> None:
        with self._lock:
            self._states.pop(output_path, None)
            self._extras.pop(output_path, None)
