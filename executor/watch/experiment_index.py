"""The experiments under a prefix: `<prefix>/experiments/<script>-<hash>.json`, parsed and cached.

An experiment file lists every step of one DAG with its output path, version, config, current code
fingerprint and dependencies (see `executor/dag/records.py`). The file is rewritten each time its DAG
runs, so it is re-parsed only when its listing entry (size and modification time) changes; the
folder itself is listed at most every `list_ttl_s` seconds. A 10,000-step file is ~15 MB of JSON,
so parsing it once per change, not once per request, matters.

Steps are addressed by their output path relative to the prefix (`tokenizer/byte_bpe-a78ce32b`).
A step whose recorded output path is not under this prefix (the prefix was copied elsewhere, or
`override_output_path` points out of it) is mapped to `<name>-<hash[:8]>` if that exists here.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from executor.dag.identity import HASH_CHARS
from executor.store import storage
from executor.store.layout import EXPERIMENTS_DIR
from executor.watch.safety import relative_to

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dependency:
    index: int | None
    """Position of the dependency in the experiment's step list (None: not part of it)."""
    output_path: str
    blocking: bool


@dataclass(frozen=True)
class ExperimentStep:
    index: int
    name: str
    hash: str
    output_path: str
    """Where the step's files are read from (under the prefix)."""
    relative: str
    fn: str | None
    description: str | None
    fingerprint: str | None
    dependencies: tuple[Dependency, ...]


@dataclass
class Experiment:
    file: str
    caller: str | None
    description: str | None
    git_commit: str | None
    user: str | None
    created: str | None
    steps: list[ExperimentStep]
    by_relative: dict[str, ExperimentStep] = field(default_factory=dict)

    @property
    def script(self) -> str:
        return posixpath.basename(self.caller) if self.caller else self.file

    @property
    def output_paths(self) -> list[str]:
        return [step.output_path for step in self.steps]


def parse_experiment(prefix: str, file: str, record: dict[str, Any]) -> Experiment:
    raw_steps = record.get("steps") or []
    index_of = {step["output_path"]: index for index, step in enumerate(raw_steps)}
    steps = []
    for index, raw in enumerate(raw_steps):
        relative = relative_to(prefix, raw["output_path"]) or f"{raw['name']}-{raw['hash'][:HASH_CHARS]}"
        dependencies = tuple(
            Dependency(index_of.get(dep["output_path"]), dep["output_path"], bool(dep.get("blocking", True)))
            for dep in raw.get("dependencies") or []
        )
        steps.append(
            ExperimentStep(
                index=index,
                name=raw["name"],
                hash=raw["hash"],
                output_path=storage.join(prefix, relative),
                relative=relative,
                fn=raw.get("fn"),
                description=raw.get("description"),
                fingerprint=raw.get("code_fingerprint"),
                dependencies=dependencies,
            )
        )
    experiment = Experiment(
        file=file,
        caller=record.get("caller"),
        description=record.get("description"),
        git_commit=record.get("git_commit"),
        user=record.get("user"),
        created=record.get("created"),
        steps=steps,
    )
    experiment.by_relative = {step.relative: step for step in steps}
    return experiment


def _signature(entry: dict[str, Any]) -> str:
    """What changes when an experiment file is rewritten, whatever the store calls it."""
    stamp = next(
        (entry[key] for key in ("mtime", "updated", "LastModified", "last_modified", "created") if key in entry), ""
    )
    return f"{entry.get('size')}:{stamp}"


class ExperimentIndex:
    """Every experiment under a prefix, newest first, re-read only when its file changes."""

    def __init__(self, prefix: str, list_ttl_s: float = 2.0):
        self.prefix = prefix
        self.folder = storage.join(prefix, EXPERIMENTS_DIR)
        self.list_ttl_s = list_ttl_s
        self._lock = threading.Lock()
        self._listed_at = -1e18
        self._signatures: dict[str, str] = {}
        self._parsed: dict[str, tuple[str, Experiment]] = {}

    def _list(self) -> dict[str, str]:
        fs, fs_path = storage.filesystem(self.folder)
        try:
            entries = fs.ls(fs_path, detail=True, refresh=True)  # object stores cache listings otherwise
        except FileNotFoundError:
            return {}
        return {
            posixpath.basename(entry["name"].rstrip("/")): _signature(entry)
            for entry in entries
            if entry.get("type") != "directory" and entry["name"].endswith(".json")
        }

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
                self._signatures = self._list()
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
        if blob is None:
            return
        try:
            record = json.loads(blob)
            self._parsed[name] = (self._signatures[name], parse_experiment(self.prefix, name, record))
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("skipping unreadable experiment file %s: %s", storage.join(self.folder, name), error)

    def get(self, file: str) -> Experiment | None:
        return next((experiment for experiment in self.all() if experiment.file == file), None)

    def containing(self, relative: str) -> Experiment | None:
        """The newest experiment that has the step stored at `relative`."""
        return next((experiment for experiment in self.all() if relative in experiment.by_relative), None)
