"""The JSON the experiment pages are drawn from: experiment lists, counts, the step table and the graph.

Everything a page needs is aggregated here, on the server, so a browser never receives 10,000
rows: the step table is filtered, sorted and paginated here, and a DAG too large to draw node by
node is drawn as groups of steps (by name prefix: `tokenize/*`, or by layer when names do not
group), each group coloured by its worst status and labelled with its counts.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from executor.store.experiments import Experiment, ExperimentStep
from executor.store.layout import HASH_CHARS
from executor.store.step_rows import StepState
from executor.watch.step_cache import StatusCache, StepExtras

NEVER_RAN = "NEVER_RAN"
STATUS_ORDER = ["FAILED", "CORRUPT", "DEP_FAILED", "RUNNING", "WAITING", NEVER_RAN, "SUCCESS"]
"""Worst first: a group's colour is the worst status among its steps."""
MAX_GRAPH_NODES = 300
MAX_PAGE_ROWS = 500
SORT_KEYS = ("order", "name", "status", "started", "duration", "attempts")


def status_key(state: StepState) -> str:
    return state.status or NEVER_RAN


def counts_of(states: Sequence[StepState]) -> dict[str, int]:
    counts = Counter(status_key(state) for state in states)
    return {status: counts[status] for status in STATUS_ORDER if counts[status]}


def experiment_summary(experiment: Experiment, states: Sequence[StepState]) -> dict[str, Any]:
    return {
        "file": experiment.file,
        "script": experiment.script,
        "caller": experiment.caller,
        "description": experiment.description,
        "git_commit": experiment.git_commit,
        "user": experiment.user,
        "created": experiment.created,
        "steps": len(experiment.steps),
        "counts": counts_of(states),
    }


def shard_totals(extras: Sequence[StepExtras]) -> dict[str, int]:
    """Sum of shard progress over the given steps (those that report any)."""
    totals = {"steps": 0, "shards_total": 0, "shards_done": 0, "rows": 0, "bytes": 0}
    for extra in extras:
        if not extra.progress:
            continue
        totals["steps"] += 1
        for key in ("shards_total", "shards_done", "rows", "bytes"):
            value = extra.progress.get(key)
            totals[key] += int(value) if isinstance(value, (int, float)) else 0
    return totals


@dataclass(frozen=True)
class StepQuery:
    statuses: frozenset[str] = frozenset()
    name: str = ""
    """Case-insensitive substring of the step name, or a regex written as /.../."""
    name_prefix: str = ""
    sort: str = "order"
    descending: bool = False
    offset: int = 0
    limit: int = 50

    def name_matcher(self) -> re.Pattern[str] | None:
        if not self.name:
            return None
        if len(self.name) > 2 and self.name.startswith("/") and self.name.endswith("/"):
            try:
                return re.compile(self.name[1:-1], re.IGNORECASE)
            except re.error as error:
                raise ValueError(f"bad name regex {self.name!r}: {error}") from error
        return re.compile(re.escape(self.name), re.IGNORECASE)


def _sort_value(step: ExperimentStep, state: StepState, key: str, now: float) -> Any:
    if key == "name":
        return step.name
    if key == "status":
        return STATUS_ORDER.index(status_key(state)) if status_key(state) in STATUS_ORDER else 0
    if key == "started":
        return state.started_ts or 0.0
    if key == "duration":
        return state.duration_s(now) or 0.0
    if key == "attempts":
        return state.attempts
    return step.index


def select_rows(
    experiment: Experiment, states: Sequence[StepState], query: StepQuery
) -> tuple[list[tuple[ExperimentStep, StepState]], int]:
    """The page of (step, state) pairs the query asks for, and how many matched in all."""
    matcher = query.name_matcher()
    matched = [
        (step, state)
        for step, state in zip(experiment.steps, states, strict=True)
        if (not query.statuses or status_key(state) in query.statuses)
        and (matcher is None or matcher.search(step.name))
        and step.name.startswith(query.name_prefix)
    ]
    if query.sort != "order" or query.descending:
        now = time.time()
        matched.sort(key=lambda pair: _sort_value(pair[0], pair[1], query.sort, now), reverse=query.descending)
    limit = max(1, min(query.limit, MAX_PAGE_ROWS))
    offset = max(0, query.offset)
    return matched[offset : offset + limit], len(matched)


def _figures(stats: dict[str, Any] | None) -> dict[str, Any]:
    """docs/tokens in and out, by the stats.json convention (docs_in/docs_out, tokens_in/tokens_out)."""
    if not stats:
        return {}
    keys = ("docs_in", "docs_out", "tokens_in", "tokens_out", "bytes_in", "bytes_out", "docs", "tokens")
    return {key: stats[key] for key in keys if isinstance(stats.get(key), (int, float))}


def step_row(step: ExperimentStep, state: StepState, extras: StepExtras, now: float) -> dict[str, Any]:
    return {
        "index": step.index,
        "name": step.name,
        "path": step.relative,
        "hash": step.hash[:HASH_CHARS],
        "status": status_key(state),
        "started": state.started,
        "finished": state.finished,
        "duration_s": state.duration_s(now),
        "attempts": state.attempts,
        "worker": state.worker,
        "message": f"RUNNING - {extras.holder_lost}" if extras.holder_lost else state.message,
        "holder_lost": extras.holder_lost,
        "drift": state.drifted(step.fingerprint),
        "progress": extras.progress,
        "figures": _figures(extras.stats),
    }


def steps_page(experiment: Experiment, cache: StatusCache, query: StepQuery) -> dict[str, Any]:
    states = cache.states(experiment.output_paths)
    page, matched = select_rows(experiment, states, query)
    extras = cache.extras([step.output_path for step, _ in page], [state for _, state in page])
    now = time.time()
    return {
        "total": len(experiment.steps),
        "matched": matched,
        "offset": max(0, query.offset),
        "counts": counts_of(states),
        "rows": [step_row(step, state, extra, now) for (step, state), extra in zip(page, extras, strict=True)],
    }


def _layers(experiment: Experiment) -> list[int]:
    """Longest-path depth of each step (dependencies come first in the experiment file)."""
    depth = [0] * len(experiment.steps)
    for step in experiment.steps:
        parents = [dep.index for dep in step.dependencies if dep.index is not None and dep.index < step.index]
        depth[step.index] = 1 + max((depth[index] for index in parents), default=-1)
    return depth


def _group_keys(experiment: Experiment) -> tuple[list[str], str]:
    """A group per step, by the deepest name prefix that keeps groups few enough; else by layer."""
    names = [step.name.split("/") for step in experiment.steps]
    best: list[str] | None = None
    for depth in range(1, max(len(parts) for parts in names)):
        keys = ["/".join(parts[:depth]) + "/" if len(parts) > depth else "/".join(parts) for parts in names]
        if len(set(keys)) > MAX_GRAPH_NODES:
            break
        best = keys
    if best is not None and len(set(best)) > 1:
        return best, "name"
    return [f"layer {depth}" for depth in _layers(experiment)], "layer"


def graph(experiment: Experiment, states: Sequence[StepState]) -> dict[str, Any]:
    """Nodes and edges to lay out left to right; grouped when there are too many steps to draw."""
    if len(experiment.steps) <= MAX_GRAPH_NODES:
        nodes = [
            {"id": step.index, "label": step.name, "path": step.relative, "status": status_key(state), "size": 1}
            for step, state in zip(experiment.steps, states, strict=True)
        ]
        edges = [
            {"source": dep.index, "target": step.index, "blocking": dep.blocking}
            for step in experiment.steps
            for dep in step.dependencies
            if dep.index is not None
        ]
        return {"grouped": False, "group_by": None, "nodes": nodes, "edges": edges}
    keys, group_by = _group_keys(experiment)
    ids = {key: number for number, key in enumerate(dict.fromkeys(keys))}
    members: dict[str, list[str]] = defaultdict(list)
    for key, state in zip(keys, states, strict=True):
        members[key].append(status_key(state))
    nodes = []
    for key, number in ids.items():
        counts = Counter(members[key])
        worst = next(status for status in STATUS_ORDER if counts[status])
        label = key + "*" if key.endswith("/") else key
        nodes.append(
            {
                "id": number,
                "label": label,
                "status": worst,
                "size": len(members[key]),
                "counts": dict(counts),
                "filter": {"name_prefix": key} if group_by == "name" else None,
            }
        )
    edge_set: dict[tuple[int, int], bool] = {}
    for step, key in zip(experiment.steps, keys, strict=True):
        for dep in step.dependencies:
            if dep.index is None or keys[dep.index] == key:
                continue
            pair = (ids[keys[dep.index]], ids[key])
            edge_set[pair] = edge_set.get(pair, False) or dep.blocking
    edges = [
        {"source": source, "target": target, "blocking": blocking} for (source, target), blocking in edge_set.items()
    ]
    return {"grouped": True, "group_by": group_by, "nodes": nodes, "edges": edges}
