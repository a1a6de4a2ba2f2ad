"""The `nonfinite_*` alert rules: a metric that is NaN or infinite, whichever metric it is.

The trainer records a value that is not finite as "NaN", "Infinity" or "-Infinity" (executor/store/metrics_log.py);
Levanter stops a run whose train/loss is NaN, but a gradient norm, a router statistic or an eval loss goes NaN
without stopping anything, and is the first sign of what will. So every key is looked at, grouped by what it
measures, one rule a group:

    nonfinite_loss     train/loss
    nonfinite_eval     eval/...          (eval losses, per component and macro)
    nonfinite_grad     grad/...          (gradient norms)
    nonfinite_router   router/...        (expert load, dropped fraction, bias norm)
    nonfinite_metric   any other key     (parameter norms, learning rates, throughput, ...)

An episode is a run of consecutive steps, among those that log a key of the group, at which one of them is not
finite; it fires once, at its first step, naming the keys. A healthy run costs one pass that finds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from executor.store.metrics_log import NONFINITE_READ
from executor.watch.training.metric_names import TRAIN_LOSS

GROUPS = (("eval/", "nonfinite_eval"), ("grad/", "nonfinite_grad"), ("router/", "nonfinite_router"))
Episode = tuple[str, int, float, str]
"""(rule, first step, the first non-finite value, message)."""


def rule_of(key: str) -> str:
    """The `nonfinite_*` rule that watches `key` (module docstring)."""
    if key == TRAIN_LOSS:
        return "nonfinite_loss"
    return next((rule for prefix, rule in GROUPS if key.startswith(prefix)), "nonfinite_metric")


def _bad(value: Any) -> float | None:
    """The value as a float when it is a non-finite metric, else None."""
    kind = type(value)
    if kind is float:
        return None if math.isfinite(value) else value
    return NONFINITE_READ.get(value) if kind is str else None


def _bad_keys(rows: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """The non-finite values of each step that has any."""
    found: dict[int, dict[str, float]] = {}
    for step, row in rows.items():
        for key, value in row.items():
            if key != "step" and (number := _bad(value)) is not None:
                found.setdefault(step, {})[key] = number
    return found


def nonfinite_episodes(rows: Mapping[int, Mapping[str, Any]]) -> list[Episode]:
    """Each episode of each `nonfinite_*` rule (module docstring) in a run's rows by step."""
    bad = _bad_keys(rows)
    if not bad:
        return []
    rules = {rule_of(key) for keys in bad.values() for key in keys}
    rule_by_key: dict[str, str] = {}
    episodes: list[Episode] = []
    inside: set[str] = set()
    for step in sorted(rows):
        logged = set()
        for key in rows[step]:
            rule = rule_by_key.get(key) or rule_by_key.setdefault(key, rule_of(key))
            if rule in rules and key != "step":
                logged.add(rule)
        offending: dict[str, dict[str, float]] = {}
        for key, value in bad.get(step, {}).items():
            offending.setdefault(rule_by_key[key], {})[key] = value
        for rule, keys in offending.items():
            if rule not in inside:
                names = ", ".join(f"{key} = {_text(value)}" for key, value in sorted(keys.items()))
                first = next(iter(sorted(keys)))
                episodes.append((rule, step, keys[first], f"not finite at step {step}: {names}"))
        inside = (inside & (rules - logged)) | set(offending)
    return episodes


def _text(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
