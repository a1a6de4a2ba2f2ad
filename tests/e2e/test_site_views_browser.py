"""What the published run view draws, in headless Chromium: the metric the band was fitted on, the extremes
of a long run, and every metric key (support/band_dag.py's real DAG, published, served by `python -m http.server`).

Screenshots: `$TEST_ARTIFACTS_DIR/dashboard/site-band-run.png`, `site-band-ladder.png`, `site-long-run.png`,
`site-metrics-search.png`, `site-compare-flops.png` (the ladder overlay against training FLOPs).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from band_dag import BAND, MACRO_FINAL, NAN_STEP, SPIKE_STEP, SUITE_FINAL, build_band_prefix
from browser_fixtures import DEADLINE_MS, expect, screenshot
from test_publish_browser import check_page_builds_the_servers_views, record_requests, static_server

from executor.watch.site.publish import SitePublisher

pytestmark = pytest.mark.browser



@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("band")
    paths = build_band_prefix(root / "prefix")
    SitePublisher(str(root / "prefix"), str(root / "site")).cycle()
    return {"prefix": root / "prefix", "site": root / "site", "paths": paths}


def chart_data(page: Any, chart: str, attribute: str) -> Any:
    return json.loads(page.locator(f'[data-testid=run-view] [data-chart="{chart}"]').get_attribute(f"data-{attribute}"))


def test_the_run_view_draws_the_metric_the_band_was_fitted_on(page, published) -> None:  # type: ignore[no-untyped-def]
    """The hero's last eval point is the evaluate step's result, inside the band as the ladder page says; the
    eval/macro_loss the band was not fitted on (above it) is not the one drawn against it."""
    paths, site = published["paths"], published["site"]
    results = json.loads((published["prefix"] / paths["evaluate/hero"] / "results.json").read_text())
    assert results["macro_loss"] == pytest.approx(SUITE_FINAL)
    urls = record_requests(page)
    with static_server(site) as base:
        page.goto(f"{base}/index.html#/step/{paths['train/hero']}")
        last = page.locator("[data-testid=last-eval]")
        expect(last).to_have_attribute("data-key", "eval/suite/macro_loss", timeout=DEADLINE_MS)
        assert float(last.get_attribute("data-value")) == pytest.approx(results["macro_loss"], rel=1e-9)
        expect(last).to_have_attribute("data-verdict", "inside")
        expect(last).to_contain_text(f"inside the band [{BAND[0]:.4f}, {BAND[1]:.4f}]")
        drawn = chart_data(page, "loss", "last")
        assert "eval/macro_loss" not in drawn  # the metric the band was not fitted on (5.488: above it)
        assert drawn["eval/suite/macro_loss"][0] == 199
        assert drawn["eval/suite/macro_loss"][1] == pytest.approx(results["macro_loss"], rel=1e-6)
        assert BAND[0] <= drawn["predicted low"][1] <= drawn["eval/suite/macro_loss"][1] <= drawn["predicted high"][1]
        seal = page.locator("[data-testid=sealed-prediction]")
        prediction = (published["prefix"] / paths["scaling/ladder"] / "prediction.json").read_bytes()
        expect(seal).to_have_attribute("data-sha256", hashlib.sha256(prediction).hexdigest())
        expect(seal).to_have_attribute("data-before", "true")
        expect(seal).to_have_attribute("data-matches", "true")
        expect(seal).to_contain_text(", before the first step at ")
        screenshot(page, "site-band-run")
        check_page_builds_the_servers_views(page, published["prefix"], paths["train/hero"])

        page.goto(f"{base}/index.html#/step/{paths['scaling/ladder']}")
        achieved = page.locator("[data-testid=achieved]")
        expect(achieved).to_contain_text("inside the band", timeout=DEADLINE_MS)
        assert float(achieved.get_attribute("data-value")) == pytest.approx(results["macro_loss"], rel=1e-9)
        screenshot(page, "site-band-ladder")
    assert MACRO_FINAL > BAND[1]
    assert all(url.startswith(base + "/") or url.startswith("data:") for url in urls), urls


def test_a_long_runs_spike_and_nans_are_drawn_marked_and_named(page, published) -> None:  # type: ignore[no-untyped-def]
    """6,000 steps, past the run view's buckets: the one-step spike is drawn, both NaNs are marked on the chart
    and named in the header, and the header's last step is the run's last (NaN) step, not its last finite one."""
    with static_server(published["site"]) as base:
        page.goto(f"{base}/index.html#/step/{published['paths']['train/long']}")
        header = page.locator("[data-testid=run-view] [data-testid=nonfinite]")
        expect(header).to_contain_text("train/loss is not finite at 2 step(s)", timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=run-view] .meta b").first).to_have_text("5,999")
        expect(page.locator("[data-testid=last-train-loss]")).to_have_text("nan")
        markers = chart_data(page, "loss", "markers")
        assert ["nonfinite", NAN_STEP, "train/loss nan"] in markers and ["nonfinite", 5999, "train/loss nan"] in markers
        assert ["alert", SPIKE_STEP, "loss_spike"] in markers
        counts = chart_data(page, "loss", "points")
        assert counts["train/loss"] <= 2_100  # thinned: each bucket's min and max
        grid = page.locator('[data-testid=metrics] [data-metric="train/loss"]')
        expect(grid.locator("[data-testid=nonfinite]")).to_contain_text("2 non-finite")
        assert ["nonfinite", NAN_STEP, "nan"] in json.loads(grid.get_attribute("data-markers"))
        screenshot(page, "site-long-run")
    run = json.loads((published["site"] / "data/step" / published["paths"]["train/long"] / "run.json").read_text())
    [train] = [series for series in run["charts"][0]["series"] if series["label"] == "train/loss"]
    spike = run["charts"][0]["x"].index(SPIKE_STEP)
    assert train["values"][spike] == max(value for value in train["values"] if value is not None)


def test_every_metric_key_is_found_with_the_search_box_and_drawn(page, published) -> None:  # type: ignore[no-untyped-def]
    """Keys logged on different lines of a step are joined into one line each; train/loss comes first; a 3e-4
    learning rate gets ticks that tell it apart."""
    with static_server(published["site"]) as base:
        page.goto(f"{base}/index.html#/step/{published['paths']['train/hero']}")
        plots = page.locator("[data-testid=metrics] [data-metric]")
        expect(plots.first).to_have_attribute("data-metric", "train/loss", timeout=DEADLINE_MS)
        expect(plots).to_have_count(5)  # train/loss, the two eval metrics, the learning rate, time
        eval_plot = page.locator('[data-testid=metrics] [data-metric="eval/macro_loss"]')
        assert int(eval_plot.get_attribute("data-points")) == 4  # logged on lines of their own: drawn, not gaps
        page.locator("[data-testid=metric-search]").fill("suite")
        expect(plots).to_have_count(1)
        expect(plots.first).to_have_attribute("data-metric", "eval/suite/macro_loss")
        expect(page.locator("[data-testid=metric-count]")).to_contain_text("1 of 5 keys")
        page.locator("[data-testid=metric-search]").fill("learning")
        expect(plots.first).to_have_attribute("data-metric", "optim/learning_rate")
        ticks = page.evaluate("tickLabels(null, [0.0001, 0.00015, 0.0002, 0.00025, 0.0003])")
        assert len(set(ticks)) == 5 and all("e-4" in tick for tick in ticks), ticks
        screenshot(page, "site-metrics-search")


def test_the_ladder_overlay_toggles_between_tokens_and_flops(page, published) -> None:  # type: ignore[no-untyped-def]
    """The rungs and the target on one chart against tokens, then (the toggle) against training FLOPs: each run's
    curve ends at its own compute as prediction.json records it. Screenshot `site-compare-flops.png`."""
    ladder = published["paths"]["scaling/ladder"]
    prediction = json.loads((published["prefix"] / ladder / "prediction.json").read_text())
    with static_server(published["site"]) as base:
        page.goto(f"{base}/index.html#/step/{ladder}")
        view = page.locator("[data-testid=ladder-view]")
        expect(view.locator('[data-chart="compare"] canvas')).to_have_count(1, timeout=DEADLINE_MS)
        expect(view.locator("[data-testid=compare-axis]")).to_have_attribute("data-axis", "tokens")
        by_tokens = json.loads(view.locator('[data-chart="compare"]').get_attribute("data-last"))
        view.locator("[data-testid=compare-axis] button[data-axis=flops]").click()
        expect(view.locator("[data-testid=compare-axis]")).to_have_attribute("data-axis", "flops")
        expect(view.locator('[data-chart="compare_flops"] canvas')).to_have_count(1)
        expect(view.locator('[data-chart="compare"]')).to_have_count(0)
        expect(view.locator('[data-chart="compare_flops"] .u-legend')).to_contain_text("training FLOPs")
        by_flops = json.loads(view.locator('[data-chart="compare_flops"]').get_attribute("data-last"))
        assert set(by_flops) == set(by_tokens)
        for rung in prediction["rungs"]:
            assert by_tokens[rung["name"]][0] == rung["tokens"]
            assert by_flops[rung["name"]][0] == pytest.approx(rung["compute"], rel=1e-9)
            assert by_flops[rung["name"]][1] == by_tokens[rung["name"]][1]
        [hero] = [label for label in by_flops if label.startswith("train/hero")]
        assert by_flops[hero][0] == pytest.approx(prediction["target"]["compute"], rel=1e-9)
        screenshot(page, "site-compare-flops")
        view.locator("[data-testid=compare-axis] button[data-axis=tokens]").click()
        expect(view.locator('[data-chart="compare"] canvas')).to_have_count(1)
