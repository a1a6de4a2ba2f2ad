"""The step page's metrics grid: every numeric key of metrics.jsonl as a series of its own, drawable.

Lines of one step are merged first (metrics_log.rows_by_step: a train step logs its train figures, its eval
figures and its data counts on separate lines of the same step, and a resumed run's later line wins), then each
key is a series over the steps that logged it, so a key logged every 100th step is one joined line, not 99 gaps
in a column. Every key is listed (`keys`: train/loss first, then the eval metric the ladder predicts, then the
rest in order) for the page's search box. Long series keep their extremes (series.py), NaN and infinite points
are listed per key, and each alert (`alerts.jsonl`) is marked on the series its rule reads. A file whose lines
carry no `step` is drawn against the line number.

The live dashboard answers `/api/step/metrics` with this, and the publisher writes the same answer, redacted,
as the site's `data/step/<R>/metrics.json`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from executor.store.metrics_log import rows_by_step
from executor.watch import files
from executor.watch.series import METRIC_BUCKETS, by_key, downsample, json_number, nonfinite
from executor.watch.training.metric_names import predicted_metric

ALERT_KEYS = {
    "nonfinite_loss": "train/loss",
    "loss_spike": "train/loss",
    "grad_spike": "grad/norm/total",
    "throughput_drop": "throughput/tokens_per_second",
    "stall": "train/loss",
    "nonfinite_grad": "grad/norm/total",
}
"""The key each alert rule reads (the band rule reads the predicted metric; expert imbalance two router keys)."""


def _public(record: Mapping[str, Any]) -> dict[str, Any]:
    return {key: json_number(value) if isinstance(value, float) else value for key, value in record.items()}


def ordered_keys(keys: set[str], rows: Mapping[int, Mapping[str, Any]]) -> list[str]:
    first = [key for key in ("train/loss", predicted_metric(rows)) if key in keys]
    return first + sorted(keys - set(first) - {"step"})


def alert_key(rule: str, rows: Mapping[int, Mapping[str, Any]]) -> list[str]:
    if rule in ("prediction_band", "nonfinite_eval"):
        return [predicted_metric(rows)]
    if rule in ("expert_imbalance", "nonfinite_router"):
        return ["router/dropped_fraction", "router/load/max_over_mean"]
    if rule == "nonfinite_metric":
        return []  # its points are marked on their own series
    return [ALERT_KEYS.get(rule, "train/loss")]


def metrics_grid(records: list[dict[str, Any]] | None, alerts: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The grid's data (module docstring) from a file's lines (None: the file does not exist)."""
    if records is None:
        return {"exists": False, "keys": [], "rows": 0}
    by_step = any(isinstance(record.get("step"), int) for record in records)
    rows = rows_by_step(records) if by_step else dict(enumerate(records))
    columns = by_key(rows)
    marks: dict[str, list[list[Any]]] = {}
    for alert in alerts:
        for key in alert_key(str(alert.get("rule")), {0: columns}):
            marks.setdefault(key, []).append([alert.get("step"), alert.get("rule")])
    series: dict[str, dict[str, Any]] = {}
    for key in ordered_keys(set(columns), {0: columns}):
        values = columns[key]
        keep = {step for step, _ in marks.get(key, []) if isinstance(step, int)}
        kept = downsample(values, METRIC_BUCKETS, keep)
        series[key] = {"x": list(kept), "y": list(kept.values()), "nonfinite": nonfinite(values),
                       "alerts": marks.get(key, []), "points": len(values)}  # fmt: skip
    return {
        "exists": True,
        "rows": len(records),
        "steps": len(rows),
        "x": "step" if by_step else "line",
        "keys": list(series),
        "series": series,
        "last": [_public(record) for record in records[-files.PREVIEW_ROWS :]],
        "thinned": any(entry["points"] > 2 * METRIC_BUCKETS for entry in series.values()),
        "buckets": METRIC_BUCKETS,
    }
