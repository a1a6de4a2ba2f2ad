"""What a member of the public sees in Chromium when something is wrong with a published run: a non-finite
gradient norm and eval loss written by the trainer's own tracker, marked on the charts and named in the header;
a prediction changed after the run sealed it, or a seal rewritten with it, turning the headline into a warning
with no verdict against the band. (The stale and stalled chips: tests/executor/watch/site/test_publish_freshness.py.)

Screenshots: `$TEST_ARTIFACTS_DIR/dashboard/site-nonfinite.png`, `site-seal-warning.png`.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from band_dag import build_band_prefix
from browser_fixtures import DEADLINE_MS, expect, screenshot
from nonfinite_dag import EVAL_NAN_STEP, GRAD_INF_STEP, build_nonfinite_prefix
from test_publish_browser import static_server

from executor.store.layout import PREDICTION_SEAL_FILE
from executor.watch.site.publish import SitePublisher

pytestmark = pytest.mark.browser


def markers(page: Any, chart: str) -> list[list[Any]]:
    box = page.locator(f'[data-testid=run-view] [data-chart="{chart}"]')
    return json.loads(box.get_attribute("data-markers"))


def test_the_trainers_nonfinite_values_are_marked_and_named(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    relative = build_nonfinite_prefix(tmp_path / "prefix")
    SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site")).cycle()
    with static_server(tmp_path / "site") as base:
        page.goto(f"{base}/index.html#/step/{relative}")
        grad = page.locator('[data-testid=run-view] [data-testid=nonfinite][data-key="grad/norm/total"]')
        expect(grad).to_contain_text(f"grad/norm/total is not finite at 1 step(s), from step {GRAD_INF_STEP}",
                                     timeout=DEADLINE_MS)  # fmt: skip
        expect(
            page.locator('[data-testid=run-view] [data-testid=nonfinite][data-key="eval/macro_loss"]')
        ).to_contain_text("(last: nan)")
        assert ["nonfinite", GRAD_INF_STEP, "grad/norm/total inf"] in markers(page, "grad_norm")
        assert ["nonfinite", EVAL_NAN_STEP, "eval/macro_loss nan"] in markers(page, "loss")
        rules = page.locator("[data-testid=alerts] li")
        expect(rules.locator("xpath=self::*[@data-rule='nonfinite_grad']")).to_have_count(1)
        expect(rules.locator("xpath=self::*[@data-rule='nonfinite_eval']")).to_have_count(1)
        screenshot(page, "site-nonfinite")


def test_a_changed_prediction_or_seal_turns_the_headline_into_a_warning(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prefix, site = tmp_path / "prefix", tmp_path / "site"
    paths = build_band_prefix(prefix, long_steps=10)
    hero, ladder = prefix / paths["train/hero"], prefix / paths["scaling/ladder"]
    publisher = SitePublisher(str(prefix), str(site))
    publisher.cycle()
    with static_server(site) as base:
        page.goto(f"{base}/index.html#/step/{paths['train/hero']}")
        expect(page.locator("[data-testid=last-eval]")).to_have_attribute("data-verdict", "inside", timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=seal-witness]")).to_have_attribute("data-witnessed", "true")
        expect(page.locator("[data-testid=seal-warning]")).to_have_count(0)

        edited = json.loads((ladder / "prediction.json").read_text())
        edited["prediction"]["high"] += 1.0  # the band widened after the run started
        (ladder / "prediction.json").write_text(json.dumps(edited))
        time.sleep(1.1)  # http.server revalidates by Last-Modified, in whole seconds
        publisher.cycle()
        page.reload()
        warning = page.locator("[data-testid=seal-warning]")
        expect(warning).to_contain_text("prediction.json changed after the run sealed it", timeout=DEADLINE_MS)
        last = page.locator("[data-testid=last-eval]")
        expect(last).to_have_attribute("data-verdict", "")
        expect(last).not_to_contain_text("inside the band")
        expect(last).to_contain_text("not judged against the band")
        screenshot(page, "site-seal-warning")
        page.goto(f"{base}/index.html#/step/{paths['scaling/ladder']}")  # the ladder page judges nothing either
        expect(page.locator("[data-testid=ladder-view] [data-testid=seal-warning]")).to_contain_text(
            "prediction.json changed after", timeout=DEADLINE_MS
        )
        expect(page.locator("[data-testid=achieved]")).not_to_contain_text("inside the band")
        page.goto(f"{base}/index.html#/step/{paths['train/hero']}")

        seal = json.loads((hero / PREDICTION_SEAL_FILE).read_text())
        digest = hashlib.sha256((ladder / "prediction.json").read_bytes()).hexdigest()
        (hero / PREDICTION_SEAL_FILE).write_text(json.dumps({**seal, "sha256": digest}))  # rewritten to match
        time.sleep(1.1)
        publisher.cycle()
        page.reload()
        expect(warning).to_contain_text("not the one the publisher witnessed", timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=seal-witness]")).to_have_attribute("data-witnessed", "false")
        expect(last).to_have_attribute("data-verdict", "")
