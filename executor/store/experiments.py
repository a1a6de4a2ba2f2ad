"""The one reader of a prefix's experiment files: `<prefix>/experiments/<script>-<hash>.json`.

An experiment file lists every step of one DAG run with its output path, version, config, current code
fingerprint and dependencies (executor/dag/records.py writes it, each time its DAG runs). The command line
(`status`, `pin`, `compare`, `explain`), the dashboard and the site all read them through here:

    read_experiment(path)          the record, or FileNotFoundError naming the path
    experiment_files(prefix)       file name -> a signature that changes when the file is rewritten
    experiments_by_age(prefix)     every readable record, oldest first (a file that is not JSON is skipped, said
                                   in the log)
    latest_experiment(prefix, s)   the newest file (of script `s`)
    current_fingerprints(prefix)   output path -> the code fingerprint the newest run that planned it recorded
    parse_experiment(...)          a record as `Experiment`: its steps addressed relative to the prefix

A step whose recorded output path is not under this prefix (the prefix was copied elsewhere, or
`override_output_path` points out of it) is mapped to `<name>-<hash[:8]>`, where a copied prefix holds it.
"""

from __future__ import annotations

import json
import logging
import posixpath
from dataclasses import dataclass, field
from typing import Any

from executor.store import storage
from executor.store.layout import EXPERIMENTS_DIR, HASH_CHARS, relative_to

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


def experiments_folder(prefix: str) -> str:
    return storage.join(prefix, EXPERIMENTS_DIR)


def read_experiment(path: str) -> dict[str, Any]:
    record = storage.read_json(path)
    if record is None:
        raise FileNotFoundError(f"no experiment file at {path}")
    return record


def _signature(entry: dict[str, Any]) -> str:
    """What changes when an experiment file is rewritten, whatever the store calls it."""
    stamp = next(
        (entry[key] for key in ("mtime", "updated", "LastModified", "last_modified", "created") if key in entry), ""
    )
    return f"{entry.get('size')}:{stamp}"


def experiment_files(prefix: str) -> dict[str, str]:
    """Each experiment file's name -> its signature (size and modification time), in one listing."""
    fs, fs_path = storage.filesystem(experiments_folder(prefix))
    try:
        entries = fs.ls(fs_path, detail=True, refresh=True)  # object stores cache listings otherwise
    except FileNotFoundError:
        return {}
    return {
        posixpath.basename(entry["name"].rstrip("/")): _signature(entry)
        for entry in entries
        if entry.get("type") != "directory" and entry["name"].endswith(".json")
    }


def parse_record(path: str, blob: bytes | None) -> dict[str, Any] | None:
    """An experiment file's bytes as its record; None (said in the log) for one missing or not a JSON object."""
    if blob is None:
        return None
    try:
        record = json.loads(blob)
    except ValueError as error:
        logger.warning("skipping unreadable experiment file %s: %s", path, error)
        return None
    if not isinstance(record, dict):
        logger.warning("skipping experiment file %s: not a JSON object", path)
        return None
    return record


def experiments_by_age(prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """Every readable experiment file under `<prefix>/experiments` with its record, oldest first (one batched read)."""
    folder = experiments_folder(prefix)
    paths = [storage.join(folder, name) for name in sorted(experiment_files(prefix))]
    records = [(path, parse_record(path, blob)) for path, blob in zip(paths, storage.read_many(paths), strict=True)]
    found = [(path, record) for path, record in records if record is not None]
    return sorted(found, key=lambda pair: pair[1].get("created", ""))


def latest_experiment(prefix: str, script: str | None = None) -> str | None:
    """The most recently written experiment file under `<prefix>/experiments` (of `script`, the
    experiment file's name without `.py`, if given), if any."""
    found = [
        path
        for path, _record in experiments_by_age(prefix)
        if script is None or storage.basename(path).rsplit("-", 1)[0] == script
    ]
    return found[-1] if found else None


def current_fingerprints(prefix: str) -> dict[str, str]:
    """Output path -> the step function's fingerprint recorded by the newest experiment that planned it.

    The command line cannot import the user's code; the newest run of it is the best word on what the
    code is now, and what a SUCCESS recorded differs from that when the code drifted."""
    fingerprints: dict[str, str] = {}
    for _path, record in experiments_by_age(prefix):
        for step in record.get("steps", []):
            if step.get("code_fingerprint"):
                fingerprints[step["output_path"]] = step["code_fingerprint"]
    return fingerprints


def parse_experiment(prefix: str, file: str, record: dict[str, Any]) -> Experiment:
    """A record as an `Experiment` whose steps are read under `prefix`; KeyError/TypeError for a malformed one."""
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
