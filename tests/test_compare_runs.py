"""Runs compared on one chart: the ladder page overlays the rungs' eval curves, the predicted curve and the
target run's eval points against tokens; a fork's run view draws its parent's figures beside its own on every
chart (tests/band_dag.py's real DAG)."""

from __future__ import annotations

import json
from pathlib import Path

from band_dag import EVAL_EVERY, build_band_prefix

from executor.dashboard.app import DashboardApp
from executor.dashboard.run_view import run_view


def test_the_ladder_overlays_rungs_and_target_and_a_fork_its_parent(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    paths = build_band_prefix(prefix, long_steps=10)
    response = DashboardApp(str(prefix)).handle("/api/step/ladder", {"path": paths["scaling/ladder"]})
    compare = json.loads(response.body)["compare"]
    assert compare["log_x"] is True and compare["x_label"] == "tokens"
    labels = [series["label"] for series in compare["series"]]
    assert labels == ["d64", "d128", "d256", "predicted", "train/hero (eval/suite/macro_loss)"]
    hero = compare["series"][-1]
    drawn = [x for x, value in zip(compare["x"], hero["values"], strict=True) if value is not None]
    assert drawn == [float(step * 1000) for step in range(EVAL_EVERY, 201, EVAL_EVERY)]  # (step + 1) x 1000 tokens

    view = run_view(str(prefix), str(prefix / paths["train/fork"]))
    charts = {chart["id"]: [series["label"] for series in chart["series"]] for chart in view["charts"]}
    assert "parent train/loss" in charts["loss"]
    assert charts["learning_rate"] == ["optim/learning_rate", "parent optim/learning_rate"]
    [parent] = [chart for chart in view["charts"] if chart["id"] == "learning_rate"]
    steps = [x for x, value in zip(parent["x"], parent["series"][1]["values"], strict=True) if value is not None]
    assert max(steps) == 100  # the parent's figures up to the fork
    # the hero logs its evals on lines of their own at a train step's number: no resume for that
    hero_view = run_view(str(prefix), str(prefix / paths["train/hero"]))
    assert [entry["kind"] for entry in hero_view["incidents"]["timeline"]] == ["start", "success"]
