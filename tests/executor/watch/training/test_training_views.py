"""The step page's run, ladder and composition views, on real step outputs, over the API and in headless Chromium.

The outputs come from one executor DAG (tests/support/views_dag.py: cells and mixture weights, a scaling step over
four rungs' figures, a tiny real Levanter MoE run naming its prediction, and that run's evaluate step); the
`built` fixture runs it once. Each API test checks a view's JSON against the files the steps wrote; each
browser test checks that the page shows those numbers and saves a screenshot to
`$TEST_ARTIFACTS_DIR/dashboard` like the other browser tests.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_dashboard_browser as browser_tests
from browser_fixtures import DEADLINE_MS, expect, screenshot
from test_train import SOURCES
from views_dag import BUCKETS, LAW_E, REPLAY_GATES, TOPICS, TRAIN_STEPS, ReplayConfig, build_views_prefix, replay_run

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.store.layout import METRICS_FILE
from executor.watch.app import DashboardApp

pytestmark = [pytest.mark.slow, pytest.mark.training, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_views_prefix(tmp_path_factory.mktemp("views"))


@pytest.fixture(scope="module")
def app(built) -> DashboardApp:
    return DashboardApp(str(built["prefix"]), live_ttl_s=0.1)


def read(built: dict[str, Any], key: str, name: str) -> Any:
    return json.loads((built["prefix"] / built["paths"][key] / name).read_text())


def get(app: DashboardApp, route: str, status: int = 200, **query: str) -> Any:
    response = app.handle(route, query)
    body = json.loads(response.body)
    assert response.status == status, body
    return body


def last_line_wins(path: Path) -> dict[int, dict[str, Any]]:
    """The metrics file's rows by step, a later line's value replacing an earlier one's."""
    rows: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("step") is not None:
            rows.setdefault(record["step"], {}).update(record)
    return rows


class Drawn(dict):
    """A drawn series, x -> y: equal to the figures it draws, which the views keep to 7 significant digits
    (executor/watch/series.py)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, dict) and dict(self) == pytest.approx(other, rel=1e-6)

    __hash__ = None  # type: ignore[assignment]


def series(chart: dict[str, Any], label: str) -> Drawn:
    values = next(entry["values"] for entry in chart["series"] if entry["label"] == label)
    return Drawn({x: value for x, value in zip(chart["x"], values, strict=True) if value is not None})


def test_each_step_gets_the_views_its_outputs_call_for(built, app) -> None:
    views = {key: get(app, "/api/step/views", path=path)["views"] for key, path in built["paths"].items()}
    assert views == {"quality": [], "cells": ["composition"], "weights": ["composition"], "scaling": ["ladder"],
                     "train": ["run", "composition"], "evaluate": [],
                     "rung1": [], "rung2": [], "rung3": [], "rung4": []}  # fmt: skip


def test_run_view_plots_the_runs_figures_with_the_prediction_overlaid(built, app) -> None:
    run = get(app, "/api/step/run", path=built["paths"]["train"])
    rows = last_line_wins(built["prefix"] / built["paths"]["train"] / "metrics.jsonl")
    charts = {chart["id"]: chart for chart in run["charts"]}
    assert list(charts) == ["loss", "learning_rate", "grad_norm", "param_norm", "router_bias", "expert_load",
                            "throughput", "mfu", "eval_domains"]  # fmt: skip
    loss = charts["loss"]
    assert series(loss, "train/loss") == {step: row["train/loss"] for step, row in rows.items() if "train/loss" in row}
    assert max(series(loss, "train/loss")) == TRAIN_STEPS - 1
    evals = {step: row["eval/macro_loss"] for step, row in rows.items() if "eval/macro_loss" in row}
    assert len(evals) >= 2 and series(loss, "eval/macro_loss") == evals
    curve = read(built, "scaling", "prediction.json")["curve"]
    assert series(loss, "predicted") == {point["step"]: point["loss"] for point in curve}
    assert series(loss, "predicted low") == {point["step"]: point["low"] for point in curve}
    assert run["prediction"] == {"source": built["paths"]["scaling"], "points": len(curve)}
    assert run["prediction_error"] is None
    assert [entry["label"] for entry in charts["expert_load"]["series"]] == ["router/load/max_over_min",
                                                                             "router/load/max_over_mean"]  # fmt: skip
    assert series(charts["router_bias"], "router/bias/norm") == {
        step: row["router/bias/norm"] for step, row in rows.items() if "router/bias/norm" in row}  # fmt: skip
    assert run["components"] == sorted(SOURCES)
    for source in SOURCES:
        assert series(charts["eval_domains"], source) == {
            step: row[f"eval/{source}/loss"] for step, row in rows.items() if f"eval/{source}/loss" in row}  # fmt: skip


def test_a_resumed_runs_later_lines_win(built, app, tmp_path) -> None:
    """A run killed after step 5 and resumed from step 3 logs steps 4-5 again: the view shows the second run."""
    copy = copy_prefix(built, tmp_path)
    metrics = copy / built["paths"]["train"] / "metrics.jsonl"
    rerun = [{"step": step, "time": 0.0, "train/loss": 10.0 + step} for step in (4, 5)]
    with metrics.open("a") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in rerun)
    loss = get(DashboardApp(str(copy)), "/api/step/run", path=built["paths"]["train"])["charts"][0]
    assert series(loss, "train/loss")[4] == 14.0 and series(loss, "train/loss")[5] == 15.0
    assert len(series(loss, "train/loss")) == TRAIN_STEPS


def test_ladder_view_shows_rungs_fit_prediction_and_the_achieved_loss(built, app) -> None:
    ladder = get(app, "/api/step/ladder", path=built["paths"]["scaling"])
    prediction = read(built, "scaling", "prediction.json")
    fit = prediction["fit"]
    assert [rung["final_loss"] for rung in ladder["rungs"]] == [rung["final_loss"] for rung in prediction["rungs"]]
    for rung in ladder["rungs"]:
        fitted = fit["asymptote"] + fit["A"] * rung["compute"] ** -fit["alpha"]
        assert rung["fitted"] == pytest.approx(fitted) and rung["residual"] == pytest.approx(
            rung["final_loss"] - fitted
        )
    assert fit["asymptote"] == LAW_E  # the fixed asymptote the scaling step was given
    achieved = read(built, "evaluate", "results.json")["macro_loss"]
    assert ladder["achieved"] == {"loss": achieved, "name": "evaluate/tiny", "path": built["paths"]["evaluate"]}
    chart = ladder["chart"]
    assert chart["log_x"] is True
    target = prediction["prediction"]["compute"]
    assert series(chart, "prediction") == {target: prediction["prediction"]["loss"]}
    assert series(chart, "band low") == {target: prediction["prediction"]["low"]}
    assert series(chart, "achieved") == {target: achieved}
    assert len(series(chart, "rungs (final loss)")) == 4 and max(series(chart, "fit")) > target


def test_composition_view_joins_cells_and_weights(built, app) -> None:
    view = get(app, "/api/step/composition", path=built["paths"]["weights"])
    composition = read(built, "cells", "composition.json")
    weights = read(built, "weights", "weights.json")
    assert view["composition"] == built["paths"]["cells"] and view["weights"] == built["paths"]["weights"]
    assert (view["topics"], view["quality_buckets"]) == (TOPICS, BUCKETS)
    assert len(view["cells"]) == TOPICS * BUCKETS and view["tokens"] == composition["tokens"]
    assert [phase["fraction"] for phase in view["phases"]] == [0.8, 0.2]
    for cell in view["cells"]:
        stored = composition["cells"][cell["name"]]
        assert (cell["topic"], cell["bucket"], cell["tokens"]) == (stored["topic"], stored["quality_bucket"],
                                                                  stored["tokens"])  # fmt: skip
        assert cell["samples"] == stored["samples"] and cell["top_terms"] == stored["top_terms"]
        assert cell["weights"] == [phase["weights"][cell["name"]] for phase in weights["phases"]]
        assert cell["expected_epochs"] == weights["expected_epochs"][cell["name"]]
    cells_only = get(app, "/api/step/composition", path=built["paths"]["cells"])
    assert cells_only["weights"] is None and cells_only["phases"] == [] and "weights" not in cells_only["cells"][0]


def copy_prefix(built: dict[str, Any], tmp_path: Path) -> Path:
    """The prefix without checkpoints (a test that breaks files works on a copy)."""
    copy = tmp_path / "prefix"
    shutil.copytree(built["prefix"], copy, ignore=shutil.ignore_patterns("checkpoints", "wandb"), symlinks=True)
    return copy


def test_missing_or_garbled_files_give_a_clear_error_not_a_traceback(built, tmp_path) -> None:
    copy = copy_prefix(built, tmp_path)
    app = DashboardApp(str(copy))
    scaling, train, weights = (built["paths"][key] for key in ("scaling", "train", "weights"))
    # The copy's configs still name the original prefix: a path recorded under it is read under the copy's own
    # (a copied or synced prefix keeps its band), never outside it.
    assert get(app, "/api/step/run", path=train)["prediction_error"] is None
    for info in copy.glob("*/*/.executor_info"):
        info.write_text(info.read_text().replace(str(built["prefix"]), str(copy)))
    prediction = copy / scaling / "prediction.json"
    document = json.loads(prediction.read_text())
    prediction.write_text(prediction.read_text()[:200])
    error = get(app, "/api/step/ladder", 422, path=scaling)["error"]
    assert f"{prediction} is not valid JSON" in error and "rerun that step" in error
    run = get(app, "/api/step/run", path=train)
    assert run["prediction"] is None and f"{prediction} is not valid JSON" in run["prediction_error"]
    assert run["charts"][0]["id"] == "loss"

    prediction.write_text(json.dumps({**document, "fit": {"A": 1.0}}))
    assert "'fit' has no finite number 'alpha'" in get(app, "/api/step/ladder", 422, path=scaling)["error"]
    prediction.write_text(json.dumps({**document, "curve": [{"step": 1, "loss": "NaN"}]}))
    assert "curve[0] has no finite number 'loss'" in get(app, "/api/step/run", path=train)["prediction_error"]

    prediction.unlink()
    assert get(app, "/api/step/views", path=scaling)["views"] == []
    assert "no " + str(prediction) in get(app, "/api/step/ladder", 422, path=scaling)["error"]
    assert "the scaling step has not finished" in get(app, "/api/step/run", path=train)["prediction_error"]

    (copy / weights / "weights.json").write_text(json.dumps({"phases": [{"fraction": 1, "tokens": 5}]}))
    assert "phases[0] has no 'weights' object" in get(app, "/api/step/composition", 422, path=weights)["error"]
    assert "no run to show" in get(app, "/api/step/run", 422, path=built["paths"]["rung1"])["error"]


# --- in the browser -----------------------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def base_url(built) -> Iterator[str]:
    with browser_tests.served(built["prefix"]) as url:
        yield url


def points_of(page, chart_id: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    box = page.locator(f'[data-view] [data-chart="{chart_id}"]')
    expect(box.locator("canvas")).to_have_count(1, timeout=DEADLINE_MS)
    return json.loads(box.get_attribute("data-points"))


@pytest.mark.browser
def test_run_view_in_the_browser(built, page, base_url) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/step/{built['paths']['train']}")
    view = page.locator('[data-view="run"]')
    expect(view.locator("[data-chart]")).to_have_count(9, timeout=DEADLINE_MS)
    curve = read(built, "scaling", "prediction.json")["curve"]
    rows = last_line_wins(built["prefix"] / built["paths"]["train"] / "metrics.jsonl")
    loss = points_of(page, "loss")
    assert loss["predicted"] == len(curve) and loss["predicted high"] == len(curve)
    assert loss["train/loss"] == sum("train/loss" in row for row in rows.values())
    assert points_of(page, "router_bias") == {"router/bias/norm": sum("router/bias/norm" in r for r in rows.values())}
    assert set(points_of(page, "eval_domains")) == set(SOURCES)
    last = rows[max(step for step, row in rows.items() if "train/loss" in row)]["train/loss"]
    expect(view.locator("[data-testid=last-train-loss]")).to_have_text(f"{last:.4g}")
    expect(view.locator("[data-testid=prediction-link]")).to_have_text(built["paths"]["scaling"])
    screenshot(page, "view-run")


@pytest.mark.browser
def test_ladder_view_in_the_browser(built, page, base_url) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/step/{built['paths']['scaling']}")
    view = page.locator('[data-view="ladder"]')
    prediction = read(built, "scaling", "prediction.json")
    rows = view.locator("[data-testid=rungs] tbody tr")
    expect(rows).to_have_count(len(prediction["rungs"]), timeout=DEADLINE_MS)
    for rung in prediction["rungs"]:
        cell = view.locator(f'tr[data-rung="{rung["name"]}"] td[data-col="final_loss"]')
        expect(cell).to_have_text(f"{rung['final_loss']:.4f}")
        assert float(cell.get_attribute("data-value")) == rung["final_loss"]
    achieved = read(built, "evaluate", "results.json")["macro_loss"]
    expect(view.locator("[data-testid=achieved]")).to_contain_text(f"{achieved:.4f}")
    assert float(view.locator("[data-testid=achieved]").get_attribute("data-value")) == achieved
    points = points_of(page, "ladder")
    assert points["rungs (final loss)"] == 4 and points["achieved"] == 1 and points["fit"] >= 50
    screenshot(page, "view-ladder")


@pytest.mark.browser
def test_composition_view_one_click_from_the_dag(built, page, base_url) -> None:  # type: ignore[no-untyped-def]
    experiment = next(
        path.name for path in (built["prefix"] / "experiments").iterdir() if path.name.startswith("views-")
    )
    page.goto(f"{base_url}/experiment/{experiment}")
    page.locator('[data-testid=dag] g.node[data-node="mixture/weights"]').click()
    view = page.locator('[data-view="composition"]')
    grid = view.locator("[data-testid=composition-grid] td[data-cell]")
    expect(grid).to_have_count(TOPICS * BUCKETS, timeout=DEADLINE_MS)
    weights = read(built, "weights", "weights.json")
    composition = read(built, "cells", "composition.json")
    name = max(composition["cells"], key=lambda cell: composition["cells"][cell]["tokens"])
    heat = view.locator(f'[data-testid=composition-grid] td[data-cell="{name}"]')
    assert float(heat.get_attribute("data-value")) == pytest.approx(weights["phases"][0]["weights"][name])
    view.locator("[data-testid=heat]").select_option("tokens")
    expect(heat).to_have_attribute("data-value", str(composition["cells"][name]["tokens"]))
    table = view.locator("[data-testid=composition-table] tbody tr[data-cell]")
    expect(table).to_have_count(TOPICS * BUCKETS)
    expect(table.first).to_have_attribute("data-cell", name)  # sorted by tokens, most first
    view.locator('th[data-sort="expected_epochs"]').click()
    expect(view.locator('th[data-sort="expected_epochs"]')).to_have_class(re.compile("sorted desc"))
    most = max(weights["expected_epochs"].values())
    assert float(table.first.locator('td[data-col="expected_epochs"]').get_attribute("data-value")) == most
    heat.click()
    snippet = composition["cells"][name]["samples"][0]
    expect(view.locator(f'tr[data-samples="{name}"]')).to_contain_text(snippet.split("\n")[0].strip()[:60])
    screenshot(page, "view-composition")


@pytest.mark.browser
def test_run_view_grows_while_the_step_runs(built, page, base_url) -> None:  # type: ignore[no-untyped-def]
    """A step replaying the run's metrics in two parts: the open page shows the second part while the step is
    still RUNNING, without a reload."""
    prefix, train = built["prefix"], built["paths"]["train"]
    REPLAY_GATES["live"] = (threading.Event(), threading.Event())
    step = ExecutorStep(name="train/replay", fn=replay_run, config=ReplayConfig(
        metrics_path=str(prefix / train / METRICS_FILE), prediction_path=str(prefix / built["paths"]["scaling"]),
        gate=versioned("live"), output_path=THIS_OUTPUT_PATH))  # fmt: skip
    executor = Executor(str(prefix))
    runner = threading.Thread(target=executor.run, args=([step],), kwargs={"caller": "experiments/replay.py"})
    runner.start()
    try:
        output_path = browser_tests.wait_for_output_path(executor, step)
        page.goto(f"{base_url}/step/{output_path[len(str(prefix)) + 1 :]}")
        expect(page.locator("[data-testid=step-status]")).to_have_text("RUNNING", timeout=DEADLINE_MS)
        loss = page.locator('[data-view="run"] [data-chart="loss"]')
        expect(loss).to_have_attribute("data-points", re.compile('"train/loss":4,'), timeout=DEADLINE_MS)
        assert points_of(page, "loss")["predicted"] == len(read(built, "scaling", "prediction.json")["curve"])
        page.evaluate("window.__notReloaded = true")
        REPLAY_GATES["live"][0].set()
        expect(loss).to_have_attribute("data-points", re.compile(f'"train/loss":{TRAIN_STEPS},'), timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=step-status]")).to_have_text("RUNNING")
        assert page.evaluate("window.__notReloaded") is True
        screenshot(page, "view-run-live")
    finally:
        for gate in REPLAY_GATES["live"]:
            gate.set()
        runner.join(timeout=60)
