"""The experiments under a prefix for the dashboard: parsed once per change, listed at most every few seconds.

The files are read through executor/store/experiments.py, the one reader of them. A file is rewritten each time
its DAG runs, so it is re-parsed only when its listing entry (size and modification time) changes; the folder
itself is listed at most every `list_ttl_s` seconds. A 10,000-step file is ~15 MB of JSON, so parsing it once
per change, not once per request, matters.
"""

from __future__ import annotations

import logging
import threading
import time

from executor.store import storage
from executor.store.experiments import Experiment, experiment_files, experiments_folder, parse_experiment, parse_record

logger = logging.getLogger(__name__)


class ExperimentIndex:
    """Every experiment under a prefix, newest first, re-read only when its file changes."""

    def __init__(self, prefix: str, list_ttl_s: float = 2.0):
        self.prefix = prefix
        self.folder = experiments_folder(prefix)
        self.list_ttl_s = list_ttl_s
        self._lock = threading.Lock()
        self._listed_at = -1e18
        self._signatures: dict[str, str] = {}
        self._parsed: dict[str, tuple[str, Experiment]] = {}

    def expire(self) -> None:
        """List the folder again at the next look, however recent the last: a publisher's cycle sees every file
        written before it began (a rerun rewrites its experiment file in well under the listing's TTL)."""
        with self._lock:
            self._listed_at = -1e18

    def all(self) -> list[Experiment]:
        """Every experiment, newest first (by the time its DAG last started)."""
        with self._lock:
            now = time.monotonic()
            if now - self._listed_at > self.list_ttl_s:
                self._signatures = experiment_files(self.prefix)
                self._listed_at = now
            changed = [
                name
                for name, signature in self._signatures.items()
                if name not in self._parsed or self._parsed[name][0] != signature
            ]
            if changed:
                blobs = storage.read_many(storage.join(self.folder, name) for name in changed)
                for name, blob in zip(changed, blobs, strict=True):
                    self._parse_into_cache(name, blob)
            for name in list(self._parsed):
                if name not in self._signatures:
                    del self._parsed[name]
            experiments = [experiment for _signature, experiment in self._parsed.values()]
        return sorted(experiments, key=lambda experiment: experiment.created or "", reverse=True)

    def _parse_into_cache(self, name: str, blob: bytes | None) -> None:
        path = storage.join(self.folder, name)
        record = parse_record(path, blob)
        if record is None:
            return
        try:
            self._parsed[name] = (self._signatures[name], parse_experiment(self.prefix, name, record))
        except (KeyError, TypeError) as error:
            logger.warning("skipping experiment file %s: a step lacks %s", path, error)

    def get(self, file: str) -> Experiment | None:
        return next((experiment for experiment in self.all() if experiment.file == file), None)

    def containing(self, relative: str) -> Experiment | None:
        """The newest experiment that has the step stored at `relative`."""
        return next((experiment for experiment in self.all() if relative in experiment.by_relative), None)
