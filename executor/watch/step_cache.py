"""A read-through cache of step state (executor/store/step_rows.StepState), shard progress and figures, shared by
every request.

The dashboard is polled by many browser tabs for months, over DAGs of 10,000 steps on object
stores where each read is a round trip. So reads are batched (`storage.read_many`) and cached:

- a step whose last event is SUCCESS is finished: its status, progress and stats do not change
  (only a deliberate `--force_run` rewrites them), so they are re-read at most every
  `finished_ttl_s` (default five minutes);
- every other step (RUNNING, WAITING, FAILED, DEP_FAILED, never ran) may change at any moment,
  and is re-read when its cached copy is older than `live_ttl_s` (default one second).

Status files are read for all steps of a view (counts and graph colours need them); the larger
progress and stats files are read only for the rows a page actually shows, and for running steps.

A poll never waits for a refresh of what is already cached: expired entries are served as they
are while one background thread re-reads them (stale-while-revalidate), so a page is at most one
refresh behind. Only steps never seen before are read before answering.

`read_blobs` reads a local prefix with plain file reads: at 10,000 steps, resolving the fsspec
filesystem per path cost more than the reads themselves. Object stores go through
`storage.read_many` (parallel requests with retries), where the round trip dominates.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from executor.store import storage
from executor.store.layout import PROGRESS_FILE, STATS_FILE, STATUS_FILE
from executor.store.lease import holder_lost_note
from executor.store.step_rows import StepState

logger = logging.getLogger(__name__)


def read_blobs(paths: Sequence[str]) -> list[bytes | None]:
    """The bytes of each path (None where missing), read in one batch; see the module docstring."""
    if not paths:
        return []
    fs, _ = storage.filesystem(paths[0])
    if isinstance(fs, LocalFileSystem):
        return [_read_local(path) for path in paths]
    return storage.read_many(paths)  # parallel requests, with the storage layer's retries


def _read_local(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


@dataclass
class StepExtras:
    """A step's `.executor_progress` and `stats.json` (either may be missing)."""

    progress: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None
    holder_lost: str | None = None
    """A RUNNING step whose lease holder is gone: "holder lost since T; the next run takes it over"."""


@dataclass
class _Entry:
    value: Any
    fetched: float
    finished: bool


def json_or_none(blob: bytes | None) -> dict[str, Any] | None:
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
    _pending: set[str] = field(default_factory=set)
    """Paths waiting for the background refresh."""
    _refresher: threading.Thread | None = None

    def _split(self, table: dict[str, _Entry], paths: Sequence[str], now: float) -> tuple[list[str], list[str]]:
        """(never read, expired) among `paths`."""
        missing, expired = [], []
        with self._lock:
            for path in paths:
                entry = table.get(path)
                if entry is None:
                    missing.append(path)
                elif now - entry.fetched > (self.finished_ttl_s if entry.finished else self.live_ttl_s):
                    expired.append(path)
        return missing, expired

    def _read_states(self, paths: Sequence[str]) -> None:
        now = time.monotonic()
        blobs = read_blobs([storage.join(path, STATUS_FILE) for path in paths])
        fresh = [StepState.read(blob, path) for blob, path in zip(blobs, paths, strict=True)]
        with self._lock:
            for path, state in zip(paths, fresh, strict=True):
                self._states[path] = _Entry(state, now, state.status == "SUCCESS")

    def states(self, output_paths: Sequence[str]) -> list[StepState]:
        """The state of each step: steps never seen are read now; expired ones are re-read in the background."""
        missing, expired = self._split(self._states, output_paths, time.monotonic())
        if missing:
            with self._refresh_lock:  # one cold read at a time: concurrent first polls share its result
                missing, _ = self._split(self._states, missing, time.monotonic())
                if missing:
                    self._read_states(missing)
        if expired:
            self._refresh_later(expired)
        with self._lock:
            return [self._states[path].value for path in output_paths]

    def _refresh_later(self, paths: Sequence[str]) -> None:
        with self._lock:
            self._pending.update(paths)
            if self._refresher is not None and self._refresher.is_alive():
                return
            self._refresher = threading.Thread(target=self._refresh_pending, name="dashboard-refresh", daemon=True)
            self._refresher.start()

    def _refresh_pending(self) -> None:
        while True:
            with self._lock:
                paths, self._pending = sorted(self._pending), set()
            if not paths:
                return
            try:
                self._read_states(paths)
            except Exception:  # a background refresh must not die silently: log and serve what is cached
                logger.exception("dashboard: refreshing %d step statuses failed", len(paths))
                return

    def forget(self, output_paths: Iterable[str]) -> None:
        """Drop what is cached of these steps, so the next answer reads them first (the publisher's changed
        steps: a page it writes once must not show the state of a cycle before)."""
        with self._lock:
            for path in output_paths:
                self._states.pop(path, None)
                self._extras.pop(path, None)
                self._pending.discard(path)

    def extras(self, output_paths: Sequence[str], states: Sequence[StepState]) -> list[StepExtras]:
        """Progress and stats of a few steps (a page of rows); finished steps' copies are kept."""
        now = time.monotonic()
        missing, expired = self._split(self._extras, output_paths, now)
        stale = missing + expired
        if stale:
            finished = {path for path, state in zip(output_paths, states, strict=True) if state.status == "SUCCESS"}
            pairs = list(zip(output_paths, states, strict=True))
            running = {path: state.started for path, state in pairs if state.status == "RUNNING"}
            blobs = read_blobs([storage.join(path, name) for path in stale for name in (PROGRESS_FILE, STATS_FILE)])
            lost = {path: holder_lost_note(path, running[path]) for path in stale if path in running}
            with self._lock:
                for index, path in enumerate(stale):
                    value = StepExtras(
                        json_or_none(blobs[2 * index]), json_or_none(blobs[2 * index + 1]), lost.get(path)
                    )
                    self._extras[path] = _Entry(value, now, path in finished)
        with self._lock:
            return [self._extras[path].value for path in output_paths]
