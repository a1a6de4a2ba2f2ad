"""Whether two prefixes hold the same bytes under the same step hashes: `python -m executor compare A B`.

A step is named by its output folder relative to its prefix (`tokenized/cells-1a2b3c4d`), which is its name and
hash: the same key under two prefixes is the same step, so its output should be the same bytes. Every finished
(SUCCESS) step of either prefix, or of one experiment file, gets one of four outcomes:

    same        same hash, same result: the same output digest (the files read again, not the digests
                recorded), or files whose bytes differ but hold the same result (equivalence.py: measured times
                and the prefix set aside in JSON, a checkpoint's database compared by its keys and values, the
                run's wandb records counted), each such file named with why
    DIFFERENT   same hash, different results: the files that differ; for a `.jsonl` file (metrics.jsonl) the first
                line that differs
    only in A   finished under A only (B never ran it, or it is not SUCCESS there)
    only in B   the other way round

A step whose files no longer match its own manifest (edited after it committed) is said so: `verify` names them.
Training is not bit-exact across CPU types (other SIMD widths sum in another order): a DIFFERENT step whose two
sides ran on CPUs of another kind says so (each `.executor_info` records its worker's `machine`), and `rtol` lets
the figures of JSON and JSONL files (metrics.jsonl, stats.json, results.json) differ by that relative tolerance,
and the largest relative difference found is reported, which quantifies the drift. Every other file (shards,
weights) must be byte-identical. `same_bytes=True` (`--bytes`) asks for the same bytes everywhere, times and all. With
`recorded=True` the digests the steps recorded are compared instead of reading every file (one read per step;
tampering after commit goes unseen).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from executor.dag import equivalence
from executor.dag.records import cpu_words, hash_files, info_path, output_digest
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
    """The first differing line of a `.jsonl` file, or why two files that differ hold the same result."""
    equivalent: bool = False
    """Other bytes, the same result (equivalence.py)."""
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
        if self.outcome == Outcome.SAME and self.files:
            lines.append("             other bytes, the same result:")
            lines += [f"               {file.path}: {file.note}" for file in self.files[:SHOWN_FILES]]
            if len(self.files) > SHOWN_FILES:
                lines.append(f"               ... and {len(self.files) - SHOWN_FILES} more file(s)")
        if self.outcome == Outcome.DIFFERENT:
            differing = [file for file in self.files if not file.equivalent]
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
            lines.append("same hash, different results: the steps above are not reproducible as run (exit 1)")
        return "\n".join(lines)


def compare_prefixes(
    a: str,
    b: str,
    experiment: str | None = None,
    rtol: float | None = None,
    recorded: bool = False,
    same_bytes: bool = False,
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
            paths = storage.join(a, key), storage.join(b, key)
            steps.append(_compare_step(key, paths, (a, b), rtol, recorded, same_bytes))
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


def _compare_step(
    key: str, paths: tuple[str, str], prefixes: tuple[str, str], rtol: float | None, recorded: bool, same_bytes: bool
) -> StepComparison:
    path_a, path_b = paths
    files_a = _files_recorded(path_a) if recorded else _files_read(path_a)
    files_b = _files_recorded(path_b) if recorded else _files_read(path_b)
    digest_a, digest_b = output_digest(list(files_a.values())), output_digest(list(files_b.values()))
    comparison = StepComparison(key, Outcome.SAME, digest_a, digest_b)
    if not recorded:
        comparison.notes += _unlike_own_manifest("A", path_a, files_a) + _unlike_own_manifest("B", path_b, files_b)
    if digest_a == digest_b:
        return comparison
    differing = [path for path in sorted(files_a.keys() | files_b.keys()) if _sha(files_a, path) != _sha(files_b, path)]
    look_inside = not recorded and not same_bytes
    if look_inside:
        differing = _set_aside(comparison, differing, set(files_a) | set(files_b), paths)
    for path in differing:
        sha_a, sha_b = _sha(files_a, path), _sha(files_b, path)
        difference = FileDifference(path, sha_a, sha_b)
        if sha_a is not None and sha_b is not None and path.endswith((".json", ".jsonl")):
            difference = _look_inside(difference, paths, prefixes, rtol, look_inside)
        comparison.files.append(difference)
        comparison.max_relative = max(comparison.max_relative, difference.relative)
    if any(not file.equivalent for file in comparison.files):
        comparison.outcome = Outcome.DIFFERENT
        comparison.notes += _other_cpus(paths)
    elif comparison.files:
        comparison.files = [file for file in comparison.files if file.note]
    return comparison


def _other_cpus(paths: tuple[str, str]) -> list[str]:
    """A note where the two sides ran the step on CPUs of another kind or count (each `.executor_info`'s `machine`,
    the worker's): XLA compiles for the CPU it runs on, and splits work by its cores, so trained figures differ in
    their last bits there."""
    infos = [storage.read_json(info_path(path)) for path in paths]
    machines = [info.get("machine") if isinstance(info, dict) else None for info in infos]
    if not all(isinstance(machine, dict) for machine in machines):
        return []  # a side written before steps recorded their machine
    cpu_a, cpu_b = (f"{cpu_words(machine)} ({machine.get('cores')} cores)" for machine in machines if machine)
    if cpu_a == cpu_b:
        return []
    return [
        f"ran on other CPUs: A {cpu_a}, B {cpu_b}; XLA compiles for the CPU it runs on, so trained figures differ in "
        "their last bits there (--rtol R compares them within a relative R)"
    ]


def _sha(files: dict[str, dict[str, Any]], path: str) -> str | None:
    return files.get(path, {}).get("sha256")


def _set_aside(
    comparison: StepComparison, differing: list[str], every_path: set[str], paths: tuple[str, str]
) -> list[str]:
    """Judge the differing files of checkpoint databases (by their keys and values) and of the run's records
    (counted, not compared) as one entry each in `comparison.files`; the other differing files, to compare."""
    left = []
    databases: dict[str, list[str]] = {}
    records: dict[str, int] = {}
    roots = equivalence.database_roots(every_path)
    for path in differing:
        root = equivalence.database_of(path, roots)
        if root is not None:
            databases.setdefault(root, []).append(path)
        elif equivalence.is_run_record(path):
            records[path.split("/", 1)[0]] = records.get(path.split("/", 1)[0], 0) + 1
        else:
            left.append(path)
    for root, members in sorted(databases.items()):
        verdict = equivalence.compare_databases(*(storage.join(path, root) for path in paths))
        if verdict.equivalent:
            comparison.files.append(FileDifference(root + "/", None, None, verdict.note, equivalent=True))
        else:
            left += members
            comparison.notes.append(f"{root}/: {verdict.note}")
    for folder, count in sorted(records.items()):
        note = f"{count} file(s) that record how the run went (its times and logs), not what it computed: not compared"
        comparison.files.append(FileDifference(folder + "/", None, None, note, equivalent=True))
    return sorted(left)


def _unlike_own_manifest(side: str, output_path: str, files: dict[str, dict[str, Any]]) -> list[str]:
    """A note per file that differs from what the step's own manifest recorded (changed after it committed)."""
    recorded = _files_recorded(output_path)
    changed = sorted(path for path in files.keys() | recorded.keys() if files.get(path) != recorded.get(path))
    if not changed:
        return []
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    advice = f"python -m executor verify {output_path}"
    return [f"{side}: {shown} no longer match(es) its manifest: changed after the step committed ({advice})"]


def _look_inside(
    difference: FileDifference, paths: tuple[str, str], prefixes: tuple[str, str], rtol: float | None, settle: bool
) -> FileDifference:
    """Whether a JSON / JSONL file holds the same values (equivalence.compare_json: with `settle`, measured times
    and the prefixes set aside), else where it differs: a `.jsonl` file's first differing line."""
    name = difference.path
    text_a, text_b = (storage.read_text(storage.join(path, name)) or "" for path in paths)
    if settle or rtol is not None:
        verdict = equivalence.compare_json(name, text_a, text_b, prefixes, rtol, settle)
    else:
        verdict = equivalence.Verdict(False, equivalence.first_differing_line(text_a, text_b))
    if not verdict.equivalent and not name.endswith(".jsonl"):
        verdict = equivalence.Verdict(False)
    return FileDifference(name, difference.a, difference.b, verdict.note, verdict.equivalent, verdict.relative)
