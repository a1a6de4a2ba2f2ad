"""Read-only views of what is stored: the steps of an experiment or a prefix, with their status.

Every read here is batched (`storage.read_many`), so a view of thousands of steps costs a few
parallel round trips, not one sequential round trip per step. The CLI's `status` and the
dashboard both read through this module.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from executor.store import storage
from executor.store.events import StatusEvent, StepStatus, attempts_so_far, committed_digest, parse_events
from executor.store.layout import EXPERIMENTS_DIR, INFO_FILE, PROGRESS_FILE, STATUS_FILE
from executor.store.lease import LeaseSettings, holder_lost_note


@dataclass(frozen=True)
class StepRow:
    name: str
    label: str
    output_path: str
    status: str | None
    attempts: int
    updated: str | None
    started: str | None
    worker: str | None
    message: str | None
    drift: bool
    progress: dict[str, Any] | None = None
    """Shard progress of a RUNNING sharded step (`.executor_progress`)."""
    holder_lost: str | None = None
    """For a RUNNING step whose lease holder is gone: "holder lost since T; the next run takes it over"."""

    @property
    def shown_status(self) -> str:
        """The status as `status` prints it: RUNNING says when nothing is running it any more."""
        status = self.status or "never ran"
        return f"{status} - {self.holder_lost}" if self.holder_lost else status

    digest: str | None = None
    """The output digest its SUCCESS recorded (sha256 of the canonical manifest), if it is SUCCESS."""


def step_row(name: str, output_path: str, events: list[StatusEvent], current_fingerprint: str | None = None) -> StepRow:
    last = events[-1] if events else None
    running = [event for event in events if event.status == StepStatus.RUNNING]
    recorded = last.details.get("code_fingerprint") if last is not None else None
    return StepRow(
        name=name,
        label=storage.basename(output_path),
        output_path=output_path,
        status=str(last.status) if last else None,
        attempts=attempts_so_far(events),
        updated=last.time if last else None,
        started=running[-1].time if running else None,
        worker=last.worker if last else None,
        message=last.message if last else None,
        drift=bool(recorded and current_fingerprint and recorded != current_fingerprint),
        digest=committed_digest(events),
    )


def load_experiment(path: str) -> dict[str, Any]:
    record = storage.read_json(path)
    if record is None:
        raise FileNotFoundError(f"no experiment file at {path}")
    return record


def with_progress(rows: list[StepRow]) -> list[StepRow]:
    """Attach shard progress (one batched read) and whether the holder is lost to the RUNNING rows."""
    running = [index for index, row in enumerate(rows) if row.status == StepStatus.RUNNING]
    blobs = storage.read_many(storage.join(rows[index].output_path, PROGRESS_FILE) for index in running)
    rows = list(rows)
    settings = LeaseSettings.from_env()
    for index, blob in zip(running, blobs, strict=True):
        lost = holder_lost_note(rows[index].output_path, rows[index].started, settings)
        progress = json.loads(blob) if blob is not None else None
        rows[index] = dataclasses.replace(rows[index], progress=progress, holder_lost=lost)
    return rows


def experiment_rows(record: dict[str, Any]) -> list[StepRow]:
    steps = record["steps"]
    blobs = storage.read_many(step["status_path"] for step in steps)
    rows = [
        step_row(
            step["name"], step["output_path"], parse_events(blob, step["output_path"]), step.get("code_fingerprint")
        )
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
    see `current_fingerprints`) lets the rows tell code drift."""
    fingerprints = fingerprints or {}
    outputs = find_step_outputs(prefix)
    infos = storage.read_many(storage.join(path, INFO_FILE) for path in outputs)
    statuses = storage.read_many(storage.join(path, STATUS_FILE) for path in outputs)
    rows = []
    for path, info_blob, status_blob in zip(outputs, infos, statuses, strict=True):
        name = json.loads(info_blob).get("name") if info_blob else storage.basename(path)
        rows.append(step_row(name, path, parse_events(status_blob, path), fingerprints.get(path)))
    return with_progress(rows)


def experiments_by_age(prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """Every experiment file under `<prefix>/experiments` with its record, oldest first (one batched read)."""
    folder = storage.join(prefix, EXPERIMENTS_DIR)
    paths = [storage.join(folder, name) for name in storage.list_names(folder) if name.endswith(".json")]
    records = [
        (path, json.loads(blob)) for path, blob in zip(paths, storage.read_many(paths), strict=True) if blob is not None
    ]
    return sorted(records, key=lambda pair: pair[1].get("created", ""))


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


def status_counts(rows: list[StepRow]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        key = row.status or "NEVER_RAN"
        counts[key] = counts.get(key, 0) + 1
    return counts
