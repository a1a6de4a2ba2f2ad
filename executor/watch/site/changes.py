"""Which steps a publish cycle must look at again: those whose files changed since the last cycle, and their
neighbours in the DAG.

A step's *mark* is the listing of its top folder: each file's name, size and whatever change marks the store
lists with it (mtime and inode on a disk, generation on GCS, ETag on S3, creation time in memory://), plus the
listing of `metrics.jsonl.d/` where a run on an object store keeps its metrics. Folders are named, never looked
into: the lease folder changes with every heartbeat and logs are not published. So an idle cycle costs one
listing per step and opens no file at all, where reading each step's status, views and metrics took ~20 s on
the tiny demo's prefix.

What a step's page shows derives from its own files and from its neighbours' (a run's predicted curve is its
scaling step's output, a ladder's achieved loss its downstream evaluate step's results, a fork's curve its
parent's metrics), so a changed step is republished with its dependencies and dependents. Not tracked: a
version of the step's name written by another DAG (its explain diff) shows once that DAG's experiment file
appears, which republishes every step of that experiment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from executor.store import storage
from executor.store.experiments import Experiment
from executor.store.layout import METRICS_FILE
from executor.store.metrics_log import segments_folder

CHANGE_MARKS = ("mtime", "ino", "generation", "ETag", "etag", "updated", "LastModified", "created")
"""Listing fields that change when an object is rewritten, on the stores fsspec lists (whichever are there)."""
METRICS_SEGMENTS = storage.basename(segments_folder(METRICS_FILE))

Mark = tuple[tuple[Any, ...], ...]


def _entry_mark(entry: dict[str, Any]) -> tuple[Any, ...]:
    if entry.get("type") == "directory":
        return (entry["name"],)
    return (entry["name"], entry.get("size"), *(str(entry[key]) for key in CHANGE_MARKS if key in entry))


def step_marks(output_paths: Sequence[str]) -> list[Mark]:
    """What changes when any file a step's published pages derive from changes (module docstring), for each
    step; the listings go out together (concurrently on an object store)."""
    listings = storage.list_details_many(output_paths)
    segmented = [
        index for index, entries in enumerate(listings) if any(entry["name"] == METRICS_SEGMENTS for entry in entries)
    ]
    segments = storage.list_details_many([storage.join(output_paths[index], METRICS_SEGMENTS) for index in segmented])
    marks = [[_entry_mark(entry) for entry in entries] for entries in listings]
    for index, entries in zip(segmented, segments, strict=True):
        marks[index] += [(METRICS_SEGMENTS, *_entry_mark(entry)) for entry in entries]
    return [tuple(mark) for mark in marks]


def neighbours(experiments: Iterable[Experiment]) -> dict[str, set[str]]:
    """Each step's dependencies and dependents (relative paths), over every experiment that holds it."""
    linked: dict[str, set[str]] = {}
    for experiment in experiments:
        for step in experiment.steps:
            for dependency in step.dependencies:
                if dependency.index is None:
                    continue
                other = experiment.steps[dependency.index].relative
                linked.setdefault(step.relative, set()).add(other)
                linked.setdefault(other, set()).add(step.relative)
    return linked


class ChangeTracker:
    """Remembers each step's mark and each experiment's shape between cycles."""

    def __init__(self) -> None:
        self._marks: dict[str, Mark] = {}
        self._experiments: dict[str, tuple[tuple[str, str | None], ...]] = {}

    def dirty(self, experiments: Sequence[Experiment]) -> tuple[set[str], set[str]]:
        """(steps to republish, experiment files to republish) since the last call; everything the first time."""
        steps = {step.relative: step.output_path for experiment in experiments for step in experiment.steps}
        marks = dict(zip(steps, step_marks(list(steps.values())), strict=True))
        changed = {relative for relative, mark in marks.items() if self._marks.get(relative) != mark}
        # A rerun after a code change rewrites the same experiment file with new code fingerprints and touches no
        # step folder: the fingerprints are part of the shape, so its steps show their code drift.
        shapes = {experiment.file: tuple((step.relative, step.fingerprint) for step in experiment.steps)
                  for experiment in experiments}  # fmt: skip
        for file, shape in shapes.items():
            if self._experiments.get(file) != shape:  # a new or rerun experiment: all its steps, once
                changed.update(relative for relative, _ in shape)
        linked = neighbours(experiments)
        dirty_steps = changed | {other for relative in changed for other in linked.get(relative, ())}
        dirty_experiments = {file for file, shape in shapes.items()
                             if dirty_steps.intersection(relative for relative, _ in shape)}  # fmt: skip
        if set(self._experiments) - set(shapes):  # one was removed: the list of experiments changes
            dirty_experiments = set(shapes)
        self._marks, self._experiments = marks, shapes
        return dirty_steps, dirty_experiments

    def remark(self, relative: str, output_path: str) -> None:
        """Take a step's mark again after the publisher wrote into its folder (a run's alerts.jsonl), so its own
        write does not count as a change next cycle."""
        [self._marks[relative]] = step_marks([output_path])

    def has_metrics(self, relative: str) -> bool:
        """Whether the step's last listing showed a metrics.jsonl (or its segments' folder)."""
        return self.has(relative, METRICS_FILE, METRICS_SEGMENTS)

    def has(self, relative: str, *names: str) -> bool:
        """Whether the step's last listing showed a file (or folder) of one of these names."""
        return any(entry[0] in names for entry in self._marks.get(relative, ()))
