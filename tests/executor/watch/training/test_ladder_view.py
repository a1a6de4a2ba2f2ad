"""Runs compared on one chart: the ladder page overlays the rungs' eval curves, the predicted curve and the
target run's eval points against tokens; a fork's run view draws its parent's figures beside its own on every
chart (tests/support/band_dag.py's real DAG)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from band_dag import EVAL_EVERY, build_band_prefix

from executor.watch.app import DashboardApp
from executor.watch.training.run_view import run_view


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
    check_the_flops_axis(prefix, paths["scaling/ladder"], json.loads(response.body))

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


def check_the_flops_axis(prefix: Path, ladder: str, view: dict) -> None:
    """The same overlay against training FLOPs: each run's tokens times its FLOPs per token, which is its
    `compute` over its `tokens` as prediction.json records them (the one calculator's figures, not a second
    formula), so every rung ends at its own compute and the target's run at the target's."""
    prediction = json.loads((prefix / ladder / "prediction.json").read_text())
    target = prediction["target"]
    per_token = {rung["name"]: rung["compute"] / rung["tokens"] for rung in prediction["rungs"]}
    assert view["flops_per_token"] == per_token | {"target": target["compute"] / target["tokens"]}
    flops = view["compare_flops"]
    assert (flops["x_label"], flops["log_x"], flops["missing"]) == ("training FLOPs", True, [])
    labels = [series["label"] for series in flops["series"]]
    assert labels == [series["label"] for series in view["compare"]["series"]]
    tokens_x, flops_x = view["compare"]["x"], flops["x"]
    for name, compare_series, flops_series in zip(labels, view["compare"]["series"], flops["series"], strict=True):
        by_tokens = {x: value for x, value in zip(tokens_x, compare_series["values"], strict=True) if value is not None}
        by_flops = {x: value for x, value in zip(flops_x, flops_series["values"], strict=True) if value is not None}
        scale = per_token.get(name, target["compute"] / target["tokens"])
        assert sorted(by_flops) == pytest.approx(sorted(tokens * scale for tokens in by_tokens), rel=1e-12), name
        assert [by_flops[x] for x in sorted(by_flops)] == [by_tokens[x] for x in sorted(by_tokens)], name
    for rung in prediction["rungs"]:  # each rung's curve ends where its whole run's compute is
        [series] = [series for series in flops["series"] if series["label"] == rung["name"]]
        last = max(x for x, value in zip(flops_x, series["values"], strict=True) if value is not None)
        assert last == pytest.approx(rung["compute"], rel=1e-12)
    [hero] = [series for series in flops["series"] if series["label"].startswith("train/hero")]
    last = max(x for x, value in zip(flops_x, hero["values"], strict=True) if value is not None)
    assert last == pytest.approx(target["compute"], rel=1e-12)  # its last eval, after its last step
