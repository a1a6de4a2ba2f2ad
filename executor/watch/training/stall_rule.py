"""When a running run has gone quiet for too long: the `stalled` rule's threshold, from the run's own pace.

A fixed allowance is wrong at both ends: 30 minutes hides a hung 2-second-a-step run for 900 of its steps, and a
run whose checkpoints take 20 minutes would fire on each. So unless a step's config sets `alerts.stall_after_s`,
the allowance is derived from the run's metrics lines (`stall_threshold`):

    max(stall_min_s,                                   2 minutes: a floor, for a run's first lines
        stall_step_multiple x the median gap,          20 of its ordinary steps
        1.5 x the longest gap seen so far)             its slowest eval or checkpoint, with a margin

where a gap is the time between consecutive lines that carry `train/loss` with a higher step (a resume, which goes
back, is not a gap), and gaps over `MAX_STALL_S` (a run restarted after hours) are left out; the result is at
most `MAX_STALL_S`, what the fixed default was. A tiny run stepping every second is called stalled after 2
minutes; the hero at 10 s a step after 200 s, or 1.5x its longest checkpoint save.

A run is stalled (`stalled_since`) while its step is RUNNING with a live lease and its newest line is older than
its allowance, both read from its newest lines (training/alerts.py `stall_inputs`: a long run's first lines are
days old): the publisher's alerts (site/alerts.py) and the live dashboard without a publisher
(live_stalls.py) both ask this, so every page says the same.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from executor.watch.training.metric_names import TRAIN_LOSS

MAX_STALL_S = 1800.0


def newest_line(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The `time` and `step` of the newest line that has both (None when none has)."""
    newest: tuple[float, int] | None = None
    for record in records:
        stamp, step = record.get("time"), record.get("step")
        if isinstance(stamp, int | float) and isinstance(step, int) and (newest is None or stamp >= newest[0]):
            newest = (float(stamp), step)
    return None if newest is None else {"time": newest[0], "step": newest[1]}


def step_gaps(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """Seconds between consecutive train/loss lines whose step went up, each at most MAX_STALL_S."""
    gaps, last = [], None
    for record in records:
        stamp, step = record.get("time"), record.get("step")
        if TRAIN_LOSS not in record or not isinstance(stamp, int | float) or not isinstance(step, int):
            continue
        if last is not None and step > last[1] and 0 <= stamp - last[0] <= MAX_STALL_S:
            gaps.append(float(stamp - last[0]))
        last = (stamp, step)
    return gaps


def stall_threshold(records: Iterable[Mapping[str, Any]], fixed: float | None, floor: float, multiple: float) -> float:
    """Seconds without a metrics line after which a running run is stalled (module docstring); `fixed`: the
    config's own allowance, which wins."""
    if fixed is not None:
        return fixed
    gaps = step_gaps(records)
    if not gaps:
        return floor
    return min(MAX_STALL_S, max(floor, multiple * statistics.median(gaps), 1.5 * max(gaps)))


def stalled_since(newest: Mapping[str, Any] | None, after_s: float, now: float) -> dict[str, Any] | None:
    """A running run's stall at `now`, as every page shows it: {"since": its newest line's time (ISO), "step": that
    line's step, "after_s": its allowance} once that line is older than the allowance, else None. Whether its lease
    is live is the caller's to know."""
    if newest is None or now - newest["time"] <= after_s:
        return None
    since = dt.datetime.fromtimestamp(newest["time"], dt.UTC).isoformat(timespec="seconds")
    return {"since": since, "step": newest["step"], "after_s": round(after_s)}
