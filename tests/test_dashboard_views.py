"""The step page's run, ladder and composition views, on real step outputs, over the API and in headless Chromium.

One executor DAG (`build_views_prefix`) makes everything the views draw, with the real step functions:

    corpus (2 sources) ─> tokenizer ─> tokenize x2 ─────────────────────────────┐
         └─> quality classifier ─> cells ─> mixture_weights (2 phases)          │
    rung d1..d4 (figures) ─> scaling (predict_from_ladder) ─> train (tiny MoE, 8 steps) ─> evaluate

The rungs are the only stand-ins: one small step each writes the figures a trained and evaluated rung leaves
(`metrics.jsonl` eval losses during training, `results.json`'s macro loss) from a known power law, so that
the real scaling step fits them; the target run is a real Levanter training whose config names the
prediction, and a real evaluate step scores it, which the ladder view reads as the achieved loss.
Screenshots go to `$TEST_ARTIFACTS_DIR/dashboard` like the other browser tests'.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import test_dashboard_browser as browser_tests
from test_dashboard_browser import DEADLINE_MS, playwright_sync, screenshot
from test_steps_train import SOURCES, build_data, tiny_shape, train_config

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, versioned
from executor.dashboard import DashboardApp, make_server, serve_in_thread
from executor.status import METRICS_FILE
from steps.cells import CellsConfig, build_cells
from steps.evaluate import EvaluateConfig, evaluate
from steps.fasttext_quality import TrainClassifierConfig, train_quality_classifier
from steps.ladder import LadderConfig, LadderRung, LadderTarget, predict_from_ladder
from steps.mixture_weights import MixtureWeightsConfig, mixture_weights
from steps.model_size import training_flops
from steps.train import TrainConfig, train
from steps.train_tokenizer import load_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.training, pytest.mark.timeout(900)]

TRAIN_STEPS = 8
BATCH = 8
TOPICS, BUCKETS = 4, 3
LAW_E, LAW_A, LAW_ALPHA = 5.6, 60.0, 0.25
RUNG_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class RungFiguresConfig:
    """What one trained and evaluated ladder rung leaves, computed from a known law."""

    compute: float
    tokens: float
    tokens_per_step: float
    offset: float
    """Added to the law's loss (the rung's own luck), so the fit has residuals."""
    output_path: str


def rung_figures(config: RungFiguresConfig) -> None:
    """Writes metrics.jsonl (per-component eval losses at fractions of training) and results.json (macro loss):
    a run at fraction f of its tokens scores as a run of f times its compute."""
    lines = []
    for fraction in RUNG_FRACTIONS:
        loss = LAW_E + LAW_A * (fraction * config.compute) ** -LAW_ALPHA + config.offset
        losses = {f"eval/{source}/loss": loss + (0.1 if index else -0.1) for index, source in enumerate(SOURCES)}
        step = round(fraction * config.tokens / config.tokens_per_step) - 1
        lines.append({"step": step, **losses, "eval/macro_loss": loss})
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    Path(config.output_path, METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    final = LAW_E + LAW_A * config.compute**-LAW_ALPHA + config.offset
    results = {"components": {source: {"loss": final} for source in SOURCES}, "macro_loss": final}
    Path(config.output_path, "results.json").write_text(json.dumps(results))


@dataclass(frozen=True)
class ReplayConfig:
    """Replays a finished run's metrics.jsonl in two parts, each released by a gate, so a page can watch it grow."""

    metrics_path: str
    prediction_path: str
    """The scaling step output whose curve the run view overlays (the field a train step names it by)."""
    gate: str
    output_path: str


REPLAY_GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


def replay_run(config: ReplayConfig) -> None:
    lines = Path(config.metrics_path).read_text().splitlines(keepends=True)
    released, finish = REPLAY_GATES[config.gate]
    metrics = Path(config.output_path, METRICS_FILE)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    half = next(n for n, line in enumerate(lines) if json.loads(line).get("step") == TRAIN_STEPS // 2)
    metrics.write_text("".join(lines[:half]))
    if not released.wait(timeout=120):
        raise TimeoutError(f"gate {config.gate} never opened")
    with metrics.open("a") as handle:
        handle.writelines(lines[half:])
    if not finish.wait(timeout=120):
        raise TimeoutError(f"gate {config.gate} never closed")


def build_views_prefix(root: Path) -> dict[str, Any]:
    """Run the DAG of the module docstring on `<root>/prefix`; returns the prefix and each step's output path."""
    data = build_data(root / "data")
    prefix = root / "prefix"
    corpus = [str(root / "data" / "corpus" / source) for source in SOURCES]
    quality = ExecutorStep(name="quality/docstrings", fn=train_quality_classifier, config=TrainClassifierConfig(
        positive_paths=[corpus[1]], negative_paths=[corpus[0]], output_path=THIS_OUTPUT_PATH, dim=16, bucket=20_000,
        epochs=10))  # fmt: skip
    cells = ExecutorStep(name="cells/code", fn=build_cells, config=CellsConfig(
        input_paths=corpus, tokenizer_path=data["tokenizer"], output_path=THIS_OUTPUT_PATH,
        quality_model_path=output_path_of(quality), topics=versioned(TOPICS), quality_buckets=versioned(BUCKETS),
        sample_docs=60, vocab_size=2000, embedding_dim=8))  # fmt: skip
    weights = ExecutorStep(name="mixture/weights", fn=mixture_weights, config=MixtureWeightsConfig(
        composition_path=output_path_of(cells), output_path=THIS_OUTPUT_PATH, train_tokens=versioned(200_000),
        phase_fractions=versioned([0.8, 0.2]), quality_multipliers=versioned([[1, 1, 1], [0.25, 1, 4]])))  # fmt: skip

    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    shape = tiny_shape(vocab)
    tokens_per_step = BATCH * shape.seq_len
    target_tokens = TRAIN_STEPS * tokens_per_step
    target_compute = training_flops(shape, target_tokens)
    rungs, ladder = [], []
    for number, (scale, offset) in enumerate(((1 / 64, 0.02), (1 / 16, -0.03), (1 / 4, 0.01), (1 / 2, 0.0)), 1):
        compute, tokens = target_compute * scale, target_tokens * scale * 64
        rung = ExecutorStep(name=f"ladder/rung-d{number}", fn=rung_figures, config=RungFiguresConfig(
            compute=versioned(compute), tokens=versioned(tokens), tokens_per_step=versioned(tokens_per_step),
            offset=versioned(offset), output_path=THIS_OUTPUT_PATH))  # fmt: skip
        rungs.append(rung)
        ladder.append(
            LadderRung(
                name=f"d{number}",
                train_path=output_path_of(rung),
                evaluate_path=output_path_of(rung),
                flops=compute,
                tokens=tokens,
                tokens_per_step=tokens_per_step,
            )
        )
    scaling = ExecutorStep(name="scaling/tiny", fn=predict_from_ladder, config=LadderConfig(
        rungs=ladder, target=LadderTarget(name="tiny", flops=target_compute, tokens=target_tokens,
                                          tokens_per_step=tokens_per_step),
        output_path=THIS_OUTPUT_PATH, asymptote=versioned(LAW_E), bootstrap_samples=versioned(200)))  # fmt: skip
    fields = {name: getattr(train_config(data, "unused", num_train_steps=TRAIN_STEPS, steps_per_eval=4,
                                         checkpoint_every_steps=TRAIN_STEPS, watch_interval=2), name)
              for name in TrainConfig.__dataclass_fields__}  # fmt: skip
    fields.update(output_path=THIS_OUTPUT_PATH, shape=versioned(shape), num_train_steps=versioned(TRAIN_STEPS),
                  prediction_path=output_path_of(scaling))  # fmt: skip
    hero = ExecutorStep(name="train/tiny", fn=train, config=TrainConfig(**fields))
    evaluation = ExecutorStep(name="evaluate/tiny", fn=evaluate, config=EvaluateConfig(
        checkpoint_path=output_path_of(hero, "checkpoints"), shape=versioned(shape), tokenizer_path=data["tokenizer"],
        components={source: data[source] for source in SOURCES}, output_path=THIS_OUTPUT_PATH,
        max_batches=2))  # fmt: skip
    executor = Executor(str(prefix))
    executor.run([weights, evaluation], caller="experiments/views.py", description="the dashboard views' DAG")
    steps = {"quality": quality, "cells": cells, "weights": weights, "scaling": scaling, "train": hero,
             "evaluate": evaluation, **{f"rung{number}": rung for number, rung in enumerate(rungs, 1)}}  # fmt: skip
    paths = {key: executor.output_paths[step][len(str(prefix)) + 1 :] for key, step in steps.items()}
    return {"prefix": prefix, "paths": paths}


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


def series(chart: dict[str, Any], label: str) -> dict[float, float]:
    values = next(entry["values"] for entry in chart["series"] if entry["label"] == label)
    return {x: value for x, value in zip(chart["x"], values, strict=True) if value is not None}


def test_each_step_gets_the_views_its_outputs_call_for(built, app) -> None:
    views = {key: get(app, "/api/step/views", path=path)["views"] for key, path in built["paths"].items()}
    assert views == {"quality": [], "cells": ["composition"], "weights": ["composition"], "scaling": ["ladder"],
                     "train": ["run"], "evaluate": [], "rung1": [], "rung2": [], "rung3": [], "rung4": []}  # fmt: skip


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
    assert len(evals) >= 2 and series(loss, "eval (macro)") == evals
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
    # The copy's configs still name the original prefix: the dashboard reads nothing outside its own.
    outside = get(app, "/api/step/run", path=train)["prediction_error"]
    assert f"prediction_path = '{built['prefix'] / scaling}' is not a path under the dashboard's prefix" in outside
    assert "is not a path under" in get(app, "/api/step/composition", 422, path=weights)["error"]
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

browser = browser_tests.browser  # the other browser tests' Chromium and page fixtures (a page fails on JS errors)
page = browser_tests.page


@pytest.fixture(scope="module")
def base_url(built) -> Iterator[str]:
    server = make_server(str(built["prefix"]), port=0, live_ttl_s=0.1)
    serve_in_thread(server)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def points_of(page, chart_id: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    box = page.locator(f'[data-view] [data-chart="{chart_id}"]')
    playwright_sync.expect(box.locator("canvas")).to_have_count(1, timeout=DEADLINE_MS)
    return json.loads(box.get_attribute("data-points"))


@pytest.mark.browser
def test_run_view_in_the_browser(built, page, base_url) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/step/{built['paths']['train']}")
    view = page.locator('[data-view="run"]')
    playwright_sync.expect(view.locator("[data-chart]")).to_have_count(9, timeout=DEADLINE_MS)
    curve = read(built, "scaling", "prediction.json")["curve"]
    rows = last_line_wins(built["prefix"] / built["paths"]["train"] / "metrics.jsonl")
    loss = points_of(page, "loss")
    assert loss["predicted"] == len(curve) and loss["predicted high"] == len(curve)
    assert loss["train/loss"] == sum("train/loss" in row for row in rows.values())
    assert points_of(page, "router_bias") == {"router/bias/norm": sum("router/bias/norm" in r for r in rows.values())}
    assert set(points_of(page, "eval_domains")) == set(SOURCES)
    last = rows[max(step for step, row in rows.items() if "train/loss" in row)]["train/loss"]
    playwright_sync.expect(view.locator("[data-testid=last-train-loss]")).to_have_text(f"{last:.4g}")
    playwright_sync.expect(view.locator("[data-testid=prediction-link]")).to_have_text(built["paths"]["scaling"])
    screenshot(page, "view-run")


@pytest.mark.browser
def test_ladder_view_in_the_browser(built, page, base_url) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base_url}/step/{built['paths']['scaling']}")
    view = page.locator('[data-view="ladder"]')
    prediction = read(built, "scaling", "prediction.json")
    rows = view.locator("[data-testid=rungs] tbody tr")
    playwright_sync.expect(rows).to_have_count(len(prediction["rungs"]), timeout=DEADLINE_MS)
    for rung in prediction["rungs"]:
        cell = view.locator(f'tr[data-rung="{rung["name"]}"] td[data-col="final_loss"]')
        playwright_sync.expect(cell).to_have_text(f"{rung['final_loss']:.4f}")
        assert float(cell.get_attribute("data-value")) == rung["final_loss"]
    achieved = read(built, "evaluate", "results.json")["macro_loss"]
    playwright_sync.expect(view.locator("[data-testid=achieved]")).to_contain_text(f"{achieved:.4f}")
    assert float(view.locator("[data-testid=achieved]").get_attribute("data-value")) == achieved
    points = points_of(page, "ladder")
    assert points["rungs (final loss)"] == 4 and points["achieved"] == 1 and points["fit"] >= 50
    screenshot(page, "view-ladder")


@pytest.mark.browser
def test_composition_view_one_click_from_the_dag(built, page, base_url) -> None:  # type: ignore[no-untyped-def]
    expect = playwright_sync.expect
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
    expect = playwright_sync.expect
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
