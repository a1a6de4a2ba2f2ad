"""`make demo` end to end: the tiny 535B-A23B DAG on a local Ray, SIGKILLed while its first rung trains, rerun
to the end, then rerun once more (tests/support/hero_run.py). Real everything: offline text through the data steps,
a BPE tokenizer, topic x quality cells, per-cell Levanter caches, a two-phase mixture, five MoE models trained
and evaluated on CPU, a scaling fit and the hero trained against its prediction. One run serves all the
assertions because Levanter's CPU compiles are the slow part."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import browser_fixtures as browser_tests
import numpy as np
import pytest
from browser_fixtures import DEADLINE_MS, expect, screenshot
from hero_run import HeroRun, checkpoint_steps, files_under
from paths import DATA, REPO
from test_publish_browser import check_hero_site
from test_redaction_corpus import EMAIL, FREE_TEXT, PLANTED, searched

from executor import read_status
from executor.store.events import StatusEvent, StepStatus, append_event
from executor.store.layout import ALERTS_FILE, INFO_FILE, METRICS_FILE, STATS_FILE
from executor.watch.site.publish import SitePublisher
from executor.watch.training.served_mixture import served_by_phase
from experiments.hero_535b import TINY_EVAL_BATCHES, TINY_HERO, TINY_RUNGS, TINY_VOCAB
from steps.tokenize.levanter_cache import load_cache
from steps.tokenize.train_tokenizer import load_tokenizer
from steps.train.train_metrics import read_metrics

TINY_STEPS = len(json.loads((DATA / "hero_step_hashes.json").read_text())["tiny"])
"""The tiny hero DAG's steps, as pinned (tests/project/test_layout.py checks the plan against the same file)."""

pytestmark = [pytest.mark.demo, pytest.mark.slow, pytest.mark.training, pytest.mark.ray, pytest.mark.timeout(3600)]

RUNGS = {name: steps for name, _d, _layers, steps in (*TINY_RUNGS, TINY_HERO)}


def train_losses(records: list[dict]) -> list[tuple[int, float]]:
    return [(record["step"], record["train/loss"]) for record in records if "train/loss" in record]


def test_every_step_succeeded_and_the_summary_says_where_and_how_well(hero_run: HeroRun) -> None:
    assert len(hero_run.outputs) == TINY_STEPS
    assert {name: read_status(str(path)) for name, path in hero_run.outputs.items()} == dict.fromkeys(
        hero_run.outputs, "SUCCESS"
    )
    summary = hero_run.resumed_output
    predicted = re.search(r"predicted d6144 loss: ([\d.]+) \(band ([\d.]+) \.\. ([\d.]+)\)", summary)
    achieved = re.search(r"achieved macro held-out loss: ([\d.]+)", summary)
    assert predicted and achieved, summary[-3000:]
    assert f"python -m executor dashboard --prefix {hero_run.prefix}" in summary
    assert f"python -m executor publish --prefix {hero_run.prefix} --to" in summary
    results = json.loads((hero_run.outputs["evaluate/d6144"] / "results.json").read_text())
    assert float(achieved.group(1)) == pytest.approx(results["macro_loss"], abs=1e-4)


def test_a_rerun_skips_every_step(hero_run: HeroRun) -> None:
    assert f"0 step(s) ran here, {TINY_STEPS} were already done" in hero_run.rerun_output, hero_run.rerun_output[-2000:]


def test_the_demo_benchmark_reads_what_the_runs_print(hero_run: HeroRun) -> None:
    """benchmarks/bench_demo.py takes its step counts and the hero's prediction, landing and error from the demo's
    own summary: the real runs' lines, as the files give them."""
    path = list(sys.path)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from bench_demo import summary_figures
    finally:
        sys.path[:] = path  # as it was: the benchmark puts its own folders first too

    rerun, resumed = summary_figures(hero_run.rerun_output), summary_figures(hero_run.resumed_output)
    assert (rerun["ran"], rerun["skipped"]) == (0, TINY_STEPS)
    assert resumed["ran"] > 0 and resumed["ran"] + resumed["skipped"] == TINY_STEPS, resumed
    band = json.loads((hero_run.outputs["scaling/ladder"] / "prediction.json").read_text())["prediction"]
    hero = json.loads((hero_run.outputs["evaluate/d6144"] / "results.json").read_text())["macro_loss"]
    assert resumed["hero_error_pct"] == round(100 * (hero - band["loss"]) / band["loss"], 2)
    figures = {key: resumed[key] for key in ("hero_predicted", "hero_low", "hero_high", "hero_achieved")}
    assert figures == {key: round(value, 4) for key, value in
                       {"hero_predicted": band["loss"], "hero_low": band["low"], "hero_high": band["high"],
                        "hero_achieved": hero}.items()}  # fmt: skip
    assert resumed["hero_inside"] is True
    with pytest.raises(ValueError, match=r"printed no 'N step\(s\) ran here' summary"):
        summary_figures(hero_run.resumed_output.split("step(s) ran here")[0])


def test_force_run_reruns_just_that_step(hero_run: HeroRun) -> None:
    forced = hero_run.forced_output
    assert f"1 step(s) ran here, {TINY_STEPS - 1} were already done" in forced, forced[-2000:]
    status = (hero_run.outputs["evaluate/d6144"] / ".executor_status").read_text()
    assert [json.loads(line)["status"] for line in status.splitlines()].count("SUCCESS") == 2
    results = json.loads((hero_run.outputs["evaluate/d6144"] / "results.json").read_text())
    assert f"achieved macro held-out loss: {results['macro_loss']:.4f}" in hero_run.forced_output
    # One machine repeats a run to the bit (docs/hero.md, "On one machine"): the same checkpoint, evaluated again.
    assert results == json.loads(hero_run.evaluated_before_force)


def test_the_killed_train_step_resumed_from_its_checkpoint(hero_run: HeroRun) -> None:
    """The rerun restored the latest complete checkpoint (step-N: the state after step N) and went on at N + 1.
    Killing the run is not instant, so that checkpoint may be later than the one seen at the kill, never earlier;
    the killed attempt's own lines stay in metrics.jsonl, before the rerun's (which start at N + 1 again unless the
    kill landed right after step N)."""
    logs = "".join(path.read_text(errors="replace") for path in sorted((hero_run.killed_step / "logs").glob("*.log")))
    resumed = [int(step) for step in re.findall(r"Resuming training from step (\d+)", logs)]
    assert len(set(resumed)) == 1, resumed  # one resume, logged by Levanter's file and the step log
    restored = resumed[0] - 1
    assert restored >= hero_run.killed_at[-1], (restored, hero_run.killed_at)
    assert re.search(rf"Loading checkpoint from \S+/checkpoints/step-{restored}\b", logs)
    steps = [step for step, _ in train_losses(read_metrics(str(hero_run.killed_step)))]
    rerun_from = len(steps) - 1 - steps[::-1].index(restored + 1)
    assert steps[:rerun_from] == list(range(rerun_from)) and rerun_from > restored, steps  # the killed attempt
    rerun = [
        step for index, step in enumerate(steps[rerun_from:]) if index == 0 or step != steps[rerun_from + index - 1]
    ]
    assert rerun == list(range(restored + 1, RUNGS["d768"])), steps
    assert checkpoint_steps(hero_run.killed_step)[-1] == RUNGS["d768"] - 1


def test_every_train_step_logged_what_the_run_view_plots(hero_run: HeroRun) -> None:
    cells = json.loads((hero_run.outputs["tokenized/cells"] / "components.json").read_text())["components"]
    for rung, steps in RUNGS.items():
        records = read_metrics(str(hero_run.outputs[f"train/{rung}"]))
        keys = set().union(*(record.keys() for record in records))
        for key in ("train/loss", "optim/muonh_lr", "optim/adamh_lr", "optim/adam_lr", "grad/norm/total",
                    "params/norm/total", "throughput/tokens_per_second", "model_flops_per_second", "eval/macro_loss",
                    "eval/suite/macro_loss", "router/bias/norm", "router/load/max_over_mean",
                    "router/dropped_fraction"):  # fmt: skip
            assert key in keys, (rung, sorted(keys))
        assert {f"eval/{cell}/loss" for cell in cells} <= keys, (rung, sorted(keys))
        losses = train_losses(records)
        assert max(step for step, _ in losses) == steps - 1
        router = [record for record in records if "router/bias/norm" in record]
        assert router[-1]["router/bias/norm"] > 0, f"{rung}: the router bias never moved"
        assert list((hero_run.outputs[f"train/{rung}"] / "wandb").glob("**/*.wandb")), f"{rung}: no wandb run"
        groups = json.loads((hero_run.outputs[f"train/{rung}"] / "optimizer_groups.json").read_text())
        assert groups["optimizer"] == "hero" and set(groups["groups"].values()) == {"muonh", "adamh", "adam"}, groups
        assert groups["groups"]["lm_head.weight"] == "adamh", groups  # the tiny scale trains with the hero's recipe
    hero = train_losses(read_metrics(str(hero_run.outputs["train/d6144"])))
    first, last = np.mean([loss for _, loss in hero[:3]]), np.mean([loss for _, loss in hero[-3:]])
    assert last < 0.8 * first, hero


def test_training_read_the_cell_caches_and_built_none(hero_run: HeroRun) -> None:
    assert files_under(hero_run.outputs["tokenized/cells"]) == hero_run.cache_files_at_kill


def tokens_per_byte(cache_dir: str, tokenizer_path: str, tokens: int) -> float:
    """Predicted tokens over the UTF-8 bytes they decode to, for the first `tokens` tokens of a validation split,
    which is what an eval of that many tokens reads (special tokens decode to no bytes, as Levanter counts)."""
    tokenizer = load_tokenizer(tokenizer_path)
    cache = load_cache(f"{cache_dir}/validation")
    stream = np.concatenate([row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))])[:tokens]
    return (len(stream) - 1) / len(tokenizer.decode(stream[1:].tolist(), skip_special_tokens=True).encode())


EVAL_RTOL = 1e-3  # an evaluate step against its train step's last eval


def test_each_evaluate_step_agrees_with_its_train_steps_last_eval(hero_run: HeroRun) -> None:
    """On the eval suite (the ladder's metric) and on every cell: the same sequences, the same figures, at the
    1e-3 test_train holds the same claim to (measured here: identical, the worst relative gap 0; 2% before)."""
    for rung, steps in RUNGS.items():
        results = json.loads((hero_run.outputs[f"evaluate/{rung}"] / "results.json").read_text())
        assert results["step"] == steps - 1 and results["metric"] == "eval_suite" and len(results["suite"]) >= 8
        records = read_metrics(str(hero_run.outputs[f"train/{rung}"]))
        last_eval = [record for record in records if "eval/suite/macro_loss" in record][-1]
        for cell, figures in results["components"].items():
            assert figures["loss"] == pytest.approx(last_eval[f"eval/{cell}/loss"], rel=EVAL_RTOL), (rung, cell)
        for subset, figures in results["suite"].items():
            expected = last_eval[f"eval/suite/{subset}/loss"]
            assert figures["loss"] == pytest.approx(expected, rel=EVAL_RTOL), (rung, subset)
        assert results["macro_loss"] == pytest.approx(last_eval["eval/suite/macro_loss"], rel=EVAL_RTOL)
        last_drops = [record for record in records if "eval/dropped_fraction" in record][-1]  # the recipe's capacity
        assert last_drops["step"] == last_eval["step"]
        dropped = last_drops["eval/dropped_fraction"]
        assert results["dropped_fraction"] == pytest.approx(dropped, rel=EVAL_RTOL, abs=1e-4)
        assert results["macro_loss"] == pytest.approx(float(np.mean([f["loss"] for f in results["suite"].values()])))
        losses = [figures["loss"] for figures in results["components"].values()]
        assert results["components_macro_loss"] == pytest.approx(float(np.mean(losses)))
    # Bits per byte: the loss in bits over the bytes the evaluated tokens decode to (the biggest cell).
    results = json.loads((hero_run.outputs["evaluate/d6144"] / "results.json").read_text())
    cells = json.loads((hero_run.outputs["tokenized/cells"] / "components.json").read_text())["components"]
    cell = max(cells, key=lambda name: cells[name]["validation_tokens"])
    figures = results["components"][cell]
    evaluated = min(TINY_EVAL_BATCHES * 8 * 64, cells[cell]["validation_tokens"])
    ratio = tokens_per_byte(str(hero_run.outputs["tokenized/cells"] / cell), str(hero_run.outputs["tokenizer/hero"]),
                            evaluated)  # fmt: skip
    assert figures["bpb"] == pytest.approx(figures["loss"] / math.log(2) * ratio, rel=0.05), figures


def test_the_prediction_was_registered_before_the_hero_started(hero_run: HeroRun) -> None:
    prediction = json.loads((hero_run.outputs["scaling/ladder"] / "prediction.json").read_text())
    assert [rung["name"] for rung in prediction["rungs"]] == [name for name, *_ in TINY_RUNGS]
    assert prediction["target"]["name"] == "d6144" and prediction["curve"]
    scaling_done = _event_time(hero_run.outputs["scaling/ladder"], "SUCCESS")
    hero_started = _event_time(hero_run.outputs["train/d6144"], "RUNNING")
    assert scaling_done < hero_started
    # ...and sealed by the hero when it started: the digest of that prediction, made before its first step
    seal = json.loads((hero_run.outputs["train/d6144"] / "prediction_seal.json").read_text())
    digest = hashlib.sha256((hero_run.outputs["scaling/ladder"] / "prediction.json").read_bytes()).hexdigest()
    assert seal["sha256"] == digest and seal["predicted_at"] == scaling_done
    timed = [record for record in read_metrics(str(hero_run.outputs["train/d6144"]))
             if isinstance(record.get("step"), int) and isinstance(record.get("time"), int | float)]  # fmt: skip
    first_step = min(timed, key=lambda record: record["step"])
    assert dt.datetime.fromisoformat(seal["predicted_at"]).timestamp() < first_step["time"]


def test_the_hero_is_served_the_mixture_it_planned(hero_run: HeroRun) -> None:
    """Per phase, every component planned at 1% or more is served within 20% of its planned share (the mixture
    blocks are large enough for the weights: experiments/hero_535b.py); check_hero_site sees no mixture_drift."""
    hero = hero_run.outputs["train/d6144"]
    mixture = json.loads((hero / "mixture.json").read_text())
    served = served_by_phase(read_metrics(str(hero)), mixture)
    assert served is not None and len(served["phases"]) == 2
    for phase in served["phases"]:
        for name, planned in phase["planned"].items():
            if planned >= 0.01:
                assert phase["served"][name] == pytest.approx(planned, rel=0.2), (phase["start_step"], name, phase)


def test_the_rungs_learn_with_compute_and_the_hero_lands_in_its_band(hero_run: HeroRun) -> None:
    """The ladder predicts the hero: the rungs' compute spans 10x or more, their macro losses fall with it, well
    below a uniform guess, and the hero's achieved macro loss lies in the band registered before it started,
    under a predicted curve that never rises. The summary prints the error in percent."""
    prediction = json.loads((hero_run.outputs["scaling/ladder"] / "prediction.json").read_text())
    rungs = prediction["rungs"]
    assert rungs[-1]["compute"] >= 10 * rungs[0]["compute"], rungs
    losses = [rung["final_loss"] for rung in rungs]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    assert losses[0] < math.log(TINY_VOCAB) - 0.5, losses
    band = prediction["prediction"]
    hero = json.loads((hero_run.outputs["evaluate/d6144"] / "results.json").read_text())["macro_loss"]
    assert band["low"] <= hero <= band["high"], (hero, band)
    curve = [point["loss"] for point in prediction["curve"]]
    assert all(later <= earlier for earlier, later in itertools.pairwise(curve)), curve
    error = 100 * (hero - band["loss"]) / band["loss"]
    assert f"achieved vs predicted: {error:+.2f}%, inside the band" in hero_run.resumed_output


def _event_time(output_path, status: str) -> str:
    events = [json.loads(line) for line in (output_path / ".executor_status").read_text().splitlines()]
    return next(event["time"] for event in events if event["status"] == status)


def test_the_dashboard_views_read_the_run(hero_run: HeroRun) -> None:
    """The run, ladder and composition views of the real run: the hero's loss curve with the ladder's prediction
    overlaid, the ladder with the hero's achieved loss, the mixture's cells."""
    from executor.watch.app import DashboardApp

    app = DashboardApp(str(hero_run.prefix))

    def view(route: str, step: str) -> dict:
        relative = str(hero_run.outputs[step].relative_to(hero_run.prefix))
        experiment = next((hero_run.prefix / "experiments").glob("hero_535b-*.json")).name
        response = app.handle(route, {"path": relative, "experiment": experiment})
        assert response.status == 200, (route, step, response.body[:500])
        return json.loads(response.body)

    assert view("/api/step/views", "train/d6144")["views"] == ["run", "composition"]
    run = view("/api/step/run", "train/d6144")
    assert run["prediction"]["source"].startswith("scaling/ladder-") and run["prediction"]["points"] > 0
    groups = json.loads((hero_run.outputs["train/d6144"] / "optimizer_groups.json").read_text())
    assert run["optimizer"] == {"optimizer": "hero", "parameters": groups["parameters"],
                                "groups": [[path, group] for path, group in groups["groups"].items()]}
    ladder = view("/api/step/ladder", "scaling/ladder")
    achieved = json.loads((hero_run.outputs["evaluate/d6144"] / "results.json").read_text())["macro_loss"]
    assert ladder["achieved"]["loss"] == pytest.approx(achieved)
    assert [rung["name"] for rung in ladder["rungs"]] == [name for name, *_ in TINY_RUNGS]
    assert view("/api/step/views", "mix/weights")["views"] == ["composition"]


# --- the real run's views in the browser ---------------------------------------------------------------------------



@pytest.fixture(scope="module")
def hero_url(hero_run: HeroRun) -> Iterator[str]:
    with browser_tests.served(hero_run.prefix) as url:
        yield url


def _points(page, chart_id: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    box = page.locator(f'[data-view] [data-chart="{chart_id}"]')
    expect(box.locator("canvas")).to_have_count(1, timeout=DEADLINE_MS)
    return json.loads(box.get_attribute("data-points"))


@pytest.mark.browser
def test_the_real_runs_views_in_the_browser(hero_run: HeroRun, page, hero_url: str) -> None:  # type: ignore[no-untyped-def]
    """The ladder of four trained rungs with the hero's achieved loss, the hero's loss curve under the ladder's
    predicted curve, and the mixture's cells: each page shows the run's own numbers (screenshots hero-*.png)."""
    relative = {name: str(path.relative_to(hero_run.prefix)) for name, path in hero_run.outputs.items()}
    prediction = json.loads((hero_run.outputs["scaling/ladder"] / "prediction.json").read_text())
    achieved = json.loads((hero_run.outputs["evaluate/d6144"] / "results.json").read_text())["macro_loss"]

    page.goto(f"{hero_url}/step/{relative['scaling/ladder']}")
    ladder = page.locator('[data-view="ladder"]')
    expect(ladder.locator("[data-testid=rungs] tbody tr")).to_have_count(len(TINY_RUNGS), timeout=DEADLINE_MS)
    for rung in prediction["rungs"]:
        cell = ladder.locator(f'tr[data-rung="{rung["name"]}"] td[data-col="final_loss"]')
        expect(cell).to_have_text(f"{rung['final_loss']:.4f}")
    expect(ladder.locator("[data-testid=achieved]")).to_contain_text(f"{achieved:.4f}")
    assert _points(page, "ladder")["rungs (final loss)"] == len(TINY_RUNGS)
    screenshot(page, "hero-ladder")

    page.goto(f"{hero_url}/step/{relative['train/d6144']}")
    run = page.locator('[data-view="run"]')
    expect(run.locator("[data-testid=prediction-link]")).to_have_text(relative["scaling/ladder"], timeout=DEADLINE_MS)
    loss = _points(page, "loss")
    steps = {step for step, _ in train_losses(read_metrics(str(hero_run.outputs["train/d6144"])))}
    assert loss["predicted"] == len(prediction["curve"]) and loss["train/loss"] == len(steps) == RUNGS["d6144"]
    mask = run.locator("[data-testid=optimizer-mask]")
    expect(mask).to_have_attribute("data-optimizer", "hero")
    mask.locator("summary").click()
    expect(mask.locator("tr", has_text="lm_head.weight")).to_contain_text("adamh")
    screenshot(page, "hero-run")

    page.goto(f"{hero_url}/step/{relative['mix/weights']}")
    cells = json.loads((hero_run.outputs["mix/cells"] / "composition.json").read_text())["cells"]
    grid = page.locator('[data-view="composition"] [data-testid=composition-grid] td[data-cell]')
    expect(grid).to_have_count(len(cells), timeout=DEADLINE_MS)
    screenshot(page, "hero-composition")


@pytest.mark.browser
def test_the_tiny_heros_prefix_published(page, hero_run: HeroRun, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The run published as a static site renders its run, ladder and composition views from a plain HTTP server
    (tests/e2e/test_publish_browser.py's check). Here, since `make test`'s workers split the suite by file and every
    reader of the run must share the worker that makes it."""
    check_hero_site(page, hero_run.prefix, hero_run.outputs, tmp_path / "site")
    relative = hero_run.outputs["train/d6144"].relative_to(hero_run.prefix)
    published = json.loads((tmp_path / "site" / "data" / "step" / relative / "run.json").read_text())["optimizer"]
    groups = json.loads((hero_run.outputs["train/d6144"] / "optimizer_groups.json").read_text())["groups"]
    assert published["groups"] == [[path, group] for path, group in groups.items()]  # redaction keeps the mask whole

    # The same prefix with test_redaction_corpus.py's secrets planted where a step records text (the last test
    # of this file: nothing reads the run after it): none reaches any published byte.
    hero = hero_run.outputs["train/d6144"]
    append_event(str(hero), StatusEvent(StepStatus.SUCCESS, attempt=9, message=FREE_TEXT,
                                        details={"launcher": EMAIL, "command": FREE_TEXT}))  # fmt: skip
    with (hero / ALERTS_FILE).open("a") as handle:
        handle.write(json.dumps({"rule": "loss_spike", "step": 1, "value": 9.0, "threshold": 4.0, "time": 1.0,
                                 "message": FREE_TEXT}) + "\n")  # fmt: skip
    with (hero / METRICS_FILE).open("a") as handle:
        handle.write(json.dumps({"step": 10**6, "time": 1.0, "note": FREE_TEXT, "launcher": EMAIL}) + "\n")
    info = json.loads((hero / INFO_FILE).read_text())
    (hero / INFO_FILE).write_text(json.dumps({**info, "config": {**info["config"], "notes": FREE_TEXT}}))
    for experiment in (hero_run.prefix / "experiments").glob("*.json"):
        experiment.write_text(json.dumps({**json.loads(experiment.read_text()), "description": FREE_TEXT}))
    stats = hero_run.outputs["mix/cells"] / STATS_FILE
    stats.write_text(json.dumps({**json.loads(stats.read_text() if stats.exists() else "{}"), "note": FREE_TEXT}))
    SitePublisher(str(hero_run.prefix), str(tmp_path / "site-planted")).cycle()
    assert not searched(tmp_path / "site-planted", PLANTED)
