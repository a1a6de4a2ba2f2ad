"""A 400k-step run (the hero's length) with one spike, one NaN and a NaN last step: the run view and the
metrics grid draw the spike, mark both NaNs, name them in the header, and the header's last step is the last
step logged (tests/support/band_dag.py writes the run through the real executor)."""

from __future__ import annotations

import math
from pathlib import Path

from band_dag import long_loss

from executor.store.layout import METRICS_FILE
from executor.watch import files
from executor.watch.metrics_view import metrics_grid
from executor.watch.series import RUN_BUCKETS, downsample
from executor.watch.training import alerts
from executor.watch.training.run_view import run_view

STEPS, SPIKE, NAN = 400_000, 123_457, 234_568


def test_a_400k_step_run_keeps_its_spike_and_names_its_nans(tmp_path: Path) -> None:
    run = tmp_path / "prefix" / "train" / "hero-0123abcd"
    run.mkdir(parents=True)
    lines = []
    for step in range(STEPS):
        loss = "NaN" if step in (NAN, STEPS - 1) else f"{long_loss(step) * (25 if step == SPIKE else 1):.6f}"
        lines.append(f'{{"step": {step}, "train/loss": {loss}}}\n')
    (run / METRICS_FILE).write_text("".join(lines))
    records = files.metrics_records(str(run / METRICS_FILE))
    assert records is not None and len(records) == STEPS
    # The rules look back 50 steps: run on the lines around the spike and the NaN, they fire what they would on all.
    around = [record for record in records if abs(record["step"] - SPIKE) < 200 or abs(record["step"] - NAN) < 200]
    alerts.record_alerts(str(run), alerts.evaluate(around, alerts.AlertRules(), now=0.0))

    view = run_view(str(tmp_path / "prefix"), str(run), records)
    assert view["last_step"] == STEPS - 1 and view["last_train_loss"] == "nan"
    assert view["nonfinite"] == [{"key": "train/loss", "count": 2, "first": NAN, "last": STEPS - 1, "value": "nan"}]
    loss = view["charts"][0]
    train = dict(zip(loss["x"], loss["series"][0]["values"], strict=True))
    assert sum(value is not None for value in train.values()) <= 2 * RUN_BUCKETS + 8
    assert train[SPIKE] == max(value for value in train.values() if value is not None)
    markers = {(marker["kind"], marker["step"]) for marker in loss["markers"]}
    assert {("nonfinite", NAN), ("nonfinite", STEPS - 1), ("alert", SPIKE), ("alert", NAN)} <= markers
    assert max(loss["x"]) == STEPS - 1  # the axis reaches the NaN the run ends on

    grid = metrics_grid(records, alerts.read_alerts(str(run)))["series"]["train/loss"]
    assert SPIKE in grid["x"] and grid["nonfinite"] == [[NAN, "nan"], [STEPS - 1, "nan"]]
    assert [SPIKE, "loss_spike"] in grid["alerts"]


def test_each_bucket_keeps_its_extremes_and_the_steps_asked_for() -> None:
    points = {step: math.sin(step / 50) for step in range(10_000)}
    points[4_321] = -7.0
    kept = downsample(points, 100, keep={777})
    assert len(kept) <= 203 and kept[4_321] == -7.0 and 777 in kept and {0, 9_999} <= set(kept)
    assert downsample({1: 1.0, 2: math.nan, 3: 2.0}, 100) == {1: 1.0, 3: 2.0}
