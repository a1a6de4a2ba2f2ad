"""Whether two prefixes hold the same bytes under the same step hashes: `python -m executor compare A B`.

A step is named by its output folder relative to its prefix (`tokenized/cells-1a2b3c4d`), which is its name and
hash: the same key under two prefixes is the same step, so its output should be the same bytes. Every finished
(SUCCESS) step of either prefix, or of one experiment file, gets one of four outcomes:

    same        same hash, same output digest (the files read again, not the digests recorded)
    DIFFERENT   same hash, different bytes: the files that differ; for a `.jsonl` file (metrics.jsonl) the first
                line that differs
    only in A   finished under A only (B never ran it, or it is not SUCCESS there)
    only in B   the other way round

A step whose files no longer match its own manifest (edited after it committed) is said so: `verify` names them.
Training is not bit-exact across CPU types (other SIMD widths sum in another order), so `rtol` lets the figures of
JSON and JSONL files (metrics.jsonl, stats.json, results.json) differ by that relative tolerance: such a file is
"equal within rtol" and the largest relative difference found is reported, which quantifies the drift. Other
files (checkpoints, shards) must be byte-identical. With `recorded=True` the digests the steps recorded are
compared instead of reading every file (one read per step; tampering after commit goes unseen).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from executor.dag.records import hash_files, output_digest
from executor.store import storage
from executor.store.events import StepStatus, parse_events
from executor.store.experiments import read_experiment
from executor.store.layout import MANIFEST_FILE, STATUS_FILE
from executor.store.step_rows import find_step_outputs

SHOWN_FILES = 20
"""Differing files listed per step; the rest are counted."""


class Outcome(StrEnum):
    SAME = "same"
    DIFFERENT = "DIFFERENT"
    ONLY_A = "only in A"
    ONLY_B = "only in B"
    NEITHER = "in neither"


@dataclass(frozen=True)
class FileDifference:
    path: str
    a: str | None
    """The file's sha256 under A, None if A has no such file."""
    b: str | None
    note: str | None = None
    """The first differing line of a `.jsonl` file, or the largest relative difference within rtol."""
    within_rtol: bool = False
    relative: float = 0.0
    """With rtol: the largest relative difference between the two files' figures."""


@dataclass
class StepComparison:
    key: str
    """The output folder relative to the prefix: `<name>-<hash>`."""
    outcome: Outcome
    digest_a: str | None = None
    digest_b: str | None = None
    files: list[FileDifference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Why a step is only on one side (its status on the other), files that do not match their own manifest."""
    max_relative: float = 0.0
    """The largest relative difference between figures of files found equal within rtol."""

    def render(self) -> list[str]:
        digests = f"  digest {(self.digest_a or self.digest_b or '')[:12]}" if self.outcome == Outcome.SAME else ""
        if self.outcome == Outcome.DIFFERENT:
            digests = f"  A {self.digest_a}  B {self.digest_b}"
        lines = [f"{self.outcome:<10} {self.key}{digests}"]
        lines += [f"             {note}" for note in self.notes]
        if self.outcome == Outcome.SAME and self.max_relative:
            lines.append(f"             equal within rtol: largest relative difference {self.max_relative:.3g}")
        if self.outcome == Outcome.DIFFERENT:
            differing = [file for file in self.files if not file.within_rtol]
            for file in differing[:SHOWN_FILES]:
                where = "only in A" if file.b is None else "only in B" if file.a is None else "differs"
                lines.append(f"             {file.path}: {where}" + (f"; {file.note}" if file.note else ""))
            if len(differing) > SHOWN_FILES:
                lines.append(f"             ... and {len(differing) - SHOWN_FILES} more file(s)")
        return lines


@dataclass
class Comparison:
    a: str
    b: str
    steps: list[StepComparison]
    rtol: float | None

    @property
    def differing(self) -> list[StepComparison]:
        return [step for step in self.steps if step.outcome == Outcome.DIFFERENT]

    def render(self) -> str:
        lines = [f"A = {self.a}", f"B = {self.b}"]
        for step in self.steps:
            lines += step.render()
        counts = {outcome: sum(step.outcome == outcome for step in self.steps) for outcome in Outcome}
        summary = ", ".join(
            f"{count} {outcome}" for outcome, count in counts.items() if count or outcome != "in neither"
        )
        lines.append(f"{len(self.steps)} step(s): {summary}")
        if self.differing:
            lines.append("same hash, different bytes: the steps above are not reproducible as run (exit 1)")
        return "\n".join(lines)


def compare_prefixes(
    a: str, b: str, experiment: str | None = None, rtol: float | None = None, recorded: bool = False
) -> Comparison:
    """Compare every finished step under `a` and `b` (or only those of the experiment file `experiment`)."""
    a, b = storage.make_absolute(a), storage.make_absolute(b)
    stored_a, stored_b = _stored_steps(a), _stored_steps(b)
    keys = sorted(stored_a.keys() | stored_b.keys())
    if experiment is not None:
        keys = experiment_keys(experiment)
    steps = []
    for key in keys:
        status_a, status_b = stored_a.get(key), stored_b.get(key)
        if status_a == StepStatus.SUCCESS and status_b == StepStatus.SUCCESS:
            steps.append(_compare_step(key, storage.join(a, key), storage.join(b, key), rtol, recorded))
            continue
        outcome = {(True, False): Outcome.ONLY_A, (False, True): Outcome.ONLY_B}.get(
            (status_a == StepStatus.SUCCESS, status_b == StepStatus.SUCCESS), Outcome.NEITHER
        )
        notes = [f"{side}: {status or 'not stored'}" for side, status in (("A", status_a), ("B", status_b))]
        steps.append(StepComparison(key, outcome, notes=notes))
    return Comparison(a, b, steps, rtol)


def experiment_keys(experiment: str) -> list[str]:
    """The steps of an experiment file, as output folders relative to the prefix the file lies under."""
    record = read_experiment(storage.make_absolute(experiment))
    prefix = storage.dirname(storage.dirname(storage.make_absolute(experiment)))
    keys = []
    for step in record["steps"]:
        path = step["output_path"]
        keys.append(path[len(prefix) + 1 :] if path.startswith(prefix + "/") else storage.basename(path))
    return keys


def _stored_steps(prefix: str) -> dict[str, str | None]:
    """Output folder relative to `prefix` -> its current status (None if it never ran)."""
    outputs = find_step_outputs(prefix)
    blobs = storage.read_many(storage.join(path, STATUS_FILE) for path in outputs)
    stored = {}
    for path, blob in zip(outputs, blobs, strict=True):
        events = parse_events(blob, path)
        stored[path[len(prefix) :].strip("/")] = str(events[-1].status) if events else None
    return stored


def _files_read(output_path: str) -> dict[str, dict[str, Any]]:
    """Path -> {path, size, sha256} of every output file, each one read and hashed now."""
    return {entry["path"]: entry for entry in hash_files(output_path)}


def _files_recorded(output_path: str) -> dict[str, dict[str, Any]]:
    manifest = storage.read_json(storage.join(output_path, MANIFEST_FILE)) or {"files": []}
    return {entry["path"]: entry for entry in manifest["files"]}


def _compare_step(key: str, path_a: str, path_b: str, rtol: float | None, recorded: bool) -> StepComparison:
    files_a = _files_recorded(path_a) if recorded else _files_read(path_a)
    files_b = _files_recorded(path_b) if recorded else _files_read(path_b)
    digest_a, digest_b = output_digest(list(files_a.values())), output_digest(list(files_b.values()))
    comparison = StepComparison(key, Outcome.SAME, digest_a, digest_b)
    if not recorded:
        comparison.notes += _unlike_own_manifest("A", path_a, files_a) + _unlike_own_manifest("B", path_b, files_b)
    if digest_a == digest_b:
        return comparison
    for path in sorted(files_a.keys() | files_b.keys()):
        sha_a, sha_b = (files.get(path, {}).get("sha256") for files in (files_a, files_b))
        if sha_a == sha_b:
            continue
        difference = FileDifference(path, sha_a, sha_b)
        if sha_a is not None and sha_b is not None:
            difference = _look_inside(difference, storage.join(path_a, path), storage.join(path_b, path), rtol)
        comparison.files.append(difference)
        comparison.max_relative = max(comparison.max_relative, difference.relative)
    if any(not file.within_rtol for file in comparison.files):
        comparison.outcome = Outcome.DIFFERENT
    return comparison


def _unlike_own_manifest(side: str, output_path: str, files: dict[str, dict[str, Any]]) -> list[str]:
    """A note per file that differs from what the step's own manifest recorded (changed after it committed)."""
    recorded = _files_recorded(output_path)
    changed = sorted(path for path in files.keys() | recorded.keys() if files.get(path) != recorded.get(path))
    if not changed:
        return []
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    advice = f"python -m executor verify {output_path}"
    return [f"{side}: {shown} no longer match(es) its manifest: changed after the step committed ({advice})"]


def _look_inside(difference: FileDifference, path_a: str, path_b: str, rtol: float | None) -> FileDifference:
    """The first differing line of a `.jsonl` file; with `rtol`, whether a JSON / JSONL file's figures agree."""
    name = difference.path
    if not name.endswith((".jsonl", ".json")):
        return difference
    text_a, text_b = storage.read_text(path_a) or "", storage.read_text(path_b) or ""
    if rtol is not None:
        largest = _json_within(text_a, text_b, rtol, lines=name.endswith(".jsonl"))
        if largest is not None:
            note = f"equal within rtol {rtol:g}: largest relative difference {largest:.3g}"
            return FileDifference(name, difference.a, difference.b, note, within_rtol=True, relative=largest)
    if name.endswith(".jsonl"):
        lines_a, lines_b = text_a.splitlines(), text_b.splitlines()
        for number, (line_a, line_b) in enumerate(zip(lines_a, lines_b, strict=False), start=1):
            if line_a != line_b:
                note = f"first differing line {number}: A {_clip(line_a)} | B {_clip(line_b)}"
                return FileDifference(name, difference.a, difference.b, note)
        note = f"A has {len(lines_a)} lines, B {len(lines_b)}; the first {min(len(lines_a), len(lines_b))} agree"
        return FileDifference(name, difference.a, difference.b, note)
    return difference


def _clip(line: str, chars: int = 160) -> str:
    return line if len(line) <= chars else line[:chars] + "…"


def _json_within(text_a: str, text_b: str, rtol: float, lines: bool) -> float | None:
    """The largest relative difference between the two documents' numbers if they agree within `rtol` (and in
    everything that is not a number); None if they do not."""
    try:
        values_a = [json.loads(line) for line in text_a.splitlines() if line.strip()] if lines else json.loads(text_a)
        values_b = [json.loads(line) for line in text_b.splitlines() if line.strip()] if lines else json.loads(text_b)
    except ValueError:
        return None
    largest = [0.0]
    return largest[0] if _agree(values_a, values_b, rtol, largest) else None


def _agree(a: Any, b: Any, rtol: float, largest: list[float]) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        if a == b or (math.isnan(a) and math.isnan(b)):
            return True
        relative = abs(a - b) / max(abs(a), abs(b))
        largest[0] = max(largest[0], relative)
        return relative <= rtol
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_agree(a[key], b[key], rtol, largest) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_agree(x, y, rtol, largest) for x, y in zip(a, b, strict=True))
    return bool(a == b)
