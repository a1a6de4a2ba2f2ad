"""Which points of a long run a chart draws: every extreme, every alert, every NaN, at any length.

A run of 390k steps cannot send 390k points a series to a browser, and thinning to every k-th step hides
exactly what a viewer looks for: a one-step spike or a NaN is almost never the k-th step. So a series longer
than `2 * buckets` points is cut into `buckets` runs of consecutive points and each keeps its lowest and its
highest point (in step order); the first and last points and every step in `keep` (the steps an alert fired at)
are kept too. A spike is the highest point of its bucket, so it is drawn whatever the zoom.

Points that are not finite cannot be drawn as a y value: `nonfinite` lists them (step, "nan" / "inf" / "-inf"),
so a chart marks them and the run view's header names them. They are read as the trainer records them, the
strings "NaN", "Infinity", "-Infinity" (executor/store/metrics_log.py), and as published, "nan", "inf", "-inf".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from executor.store.metrics_log import NONFINITE_READ
from executor.watch import files

RUN_BUCKETS = 1000
"""Buckets a run view's series is cut into: at most ~2,000 points a series, however long the run."""
METRIC_BUCKETS = 500
"""Buckets of each series in the metrics grid (many charts on one page: fewer points each)."""


def by_key(rows: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """Every numeric value by key, then by step, NaN and infinities included (as recorded, "NaN", and as
    published, "nan": metrics_log.metric_number), in one pass over the rows (a 400k-step run is read once, not
    once a chart)."""
    columns: dict[str, dict[int, float]] = {}
    for step, row in rows.items():
        for key, value in row.items():
            kind = type(value)
            if kind is float or kind is int:
                columns.setdefault(key, {})[step] = float(value)
            elif kind is str and value in NONFINITE_READ:
                columns.setdefault(key, {})[step] = NONFINITE_READ[value]
    columns.pop("step", None)
    return columns


def json_number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those go out as "nan", "inf", "-inf" (what alerts.jsonl writes)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def nonfinite(values: Mapping[int, float]) -> list[list[Any]]:
    """[step, "nan" | "inf" | "-inf"] of each point that cannot be drawn, in step order."""
    return [[step, json_number(value)] for step, value in sorted(values.items()) if not math.isfinite(value)]


def drawable(value: float) -> float:
    """A value to draw, to 7 significant digits: a float32's precision, what training figures have (the lines
    themselves go out whole), and a third of the bytes of a float64's 17 digits."""
    return float(f"{value:.7g}")


def downsample(points: Mapping[int, float], buckets: int, keep: Collection[int] = ()) -> dict[int, float]:
    """The finite points of a series to draw (module docstring): all of them when there are at most
    2 * buckets, else each bucket's lowest and highest, the first and last, and the steps in `keep`."""
    steps = sorted(step for step, value in points.items() if files.number(value) is not None)
    if len(steps) <= 2 * buckets:
        return {step: drawable(points[step]) for step in steps}
    kept = {steps[0], steps[-1], *(step for step in keep if step in points and files.number(points[step]) is not None)}
    size = len(steps) / buckets
    for bucket in range(buckets):
        chunk: Sequence[int] = steps[int(bucket * size) : int((bucket + 1) * size)]
        if chunk:
            kept.add(min(chunk, key=points.__getitem__))
            kept.add(max(chunk, key=points.__getitem__))
    return {step: drawable(points[step]) for step in sorted(kept)}
