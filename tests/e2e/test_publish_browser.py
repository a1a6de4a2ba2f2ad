"""The published site in headless Chromium, served by a plain static HTTP server (`python -m http.server`).

Every request the pages make is recorded: all of them must stay on the site's own origin (no CDN, no API).
Screenshots go to `$TEST_ARTIFACTS_DIR/dashboard/publish-*.png` like the dashboard's (docs/watching.md:
"Watch a run in public"). The fast test publishes support/publish_dag.py's DAG; the slow one publishes the dashboard
views' DAG (a real tiny Levanter run, a scaling ladder, data composition) for the ladder and composition pages.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_fixtures import ARTIFACTS, DEADLINE_MS, expect, screenshot
from publish_dag import build_publish_prefix, metrics_line
from services import free_port, wait_for_port

from executor.store.layout import METRICS_FILE
from executor.watch import files
from executor.watch.metrics_view import metrics_grid
from executor.watch.site.publish import SitePublisher
from executor.watch.site.redaction import redact
from executor.watch.training.alerts import read_alerts
from executor.watch.training.run_view import run_view

pytestmark = pytest.mark.browser



@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """`python -m http.server` on the folder: a plain static host, as a bucket's website would be."""
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, "http.server")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def record_requests(page: Any) -> list[str]:
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    return urls


def test_the_published_site_renders_from_a_static_server(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    paths = build_publish_prefix(tmp_path / "prefix")
    SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site")).cycle()
    urls = record_requests(page)
    with static_server(tmp_path / "site") as base:
        page.goto(f"{base}/index.html")
        rows = page.locator("[data-testid=experiments] tbody tr")
        expect(rows).to_have_count(1, timeout=DEADLINE_MS)
        expect(rows.first).to_contain_text("publish_demo.py")
        expect(rows.first.locator("[data-testid=alert-badge]")).to_have_text("2 alerts")
        screenshot(page, "publish-experiments")

        rows.first.click()
        expect(page.locator("[data-testid=dag] g.node")).to_have_count(3, timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=steps] tbody tr")).to_have_count(3)
        expect(page.locator("[data-testid=counts] [data-testid=alert-badge]")).to_have_text("2 alerts")
        page.locator("[data-testid=name-filter]").fill("faulty")
        expect(page.locator("[data-testid=steps] tbody tr")).to_have_count(1, timeout=DEADLINE_MS)
        screenshot(page, "publish-experiment")

        page.locator('tr[data-step="train/faulty"] a').click()
        expect(page.locator("[data-testid=step-status]")).to_have_text("SUCCESS", timeout=DEADLINE_MS)
        expect(page.locator('[data-testid=run-view] [data-chart="loss"] canvas')).to_have_count(1, timeout=DEADLINE_MS)
        alerts = page.locator("[data-testid=alerts] li")
        expect(alerts).to_have_count(2)
        expect(alerts.first).to_have_attribute("data-rule", "loss_spike")
        expect(page.locator('[data-testid=config] tr[data-key="api_token"]')).to_contain_text("<redacted>")
        expect(page.locator("[data-testid=log]")).to_have_text("(logs are not published on this site)")
        assert paths["faulty"] in page.url
        screenshot(page, "publish-run")
    outside = [url for url in urls if not url.startswith(base + "/") and not url.startswith("data:")]
    assert not outside, outside
    assert not [url for url in urls if "/api/" in url]


def rounded(value: Any) -> Any:
    """JSON-like `value` with floats to 12 significant digits (a sum in JavaScript may differ in the last bit)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item) for item in value]
    return value


def check_page_builds_the_servers_views(page: Any, prefix: Path, relative: str) -> None:
    """The run and metrics views the site's page draws are the live dashboard's answers (run_view.py,
    metrics_view.py), in their published form (the run's seal held against the site's own witness of it)."""
    output_path = str(prefix / relative)
    witness = page.evaluate("(path) => siteJson(`step/${path}/seal.json`).catch(() => null)", relative)
    expected = redact(run_view(str(prefix), output_path, witness=witness), str(prefix))
    assert rounded(page.evaluate("(path) => api('/api/step/run', { path })", relative)) == rounded(expected)
    records = files.metrics_records(f"{output_path}/{METRICS_FILE}")
    expected = redact(metrics_grid(records, read_alerts(output_path)), str(prefix))
    assert rounded(page.evaluate("(path) => api('/api/step/metrics', { path })", relative)) == rounded(expected)


def test_a_line_appended_to_a_run_shows_on_the_published_run_view(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The run view is built in the page from the published lines: the next cycle's chunk is all it needs."""
    paths = build_publish_prefix(tmp_path / "prefix")
    publisher = SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site"))
    publisher.cycle()
    urls = record_requests(page)
    with static_server(tmp_path / "site") as base:
        page.goto(f"{base}/index.html#/step/{paths['healthy']}")
        expect(page.locator('[data-testid=run-view] [data-chart="loss"] canvas')).to_have_count(1, timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=run-view] .meta b").first).to_have_text("79")
        # http.server answers a revalidation by Last-Modified, in whole seconds: a file the next cycle rewrites
        # within the second the page fetched it would be a 304 and stale. (Buckets compare ETags/generations.)
        time.sleep(1.1)
        with (tmp_path / "prefix" / paths["healthy"] / METRICS_FILE).open("a") as handle:
            handle.write(json.dumps(metrics_line(80, loss=1.25)) + "\n")
        assert publisher.cycle().files_written <= 10  # as in test_publish.test_a_republish_writes_only_what_changed
        page.reload()
        expect(page.locator("[data-testid=run-view] .meta b").first).to_have_text("80", timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=last-train-loss]")).to_have_text("1.250")
        expect(page.locator("[data-testid=metrics]")).to_contain_text("81 lines")
        screenshot(page, "publish-run-appended")
        for key in ("healthy", "faulty"):
            check_page_builds_the_servers_views(page, tmp_path / "prefix", paths[key])
    assert all(url.startswith(base + "/") or url.startswith("data:") for url in urls), urls


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.timeout(900)
def test_the_ladder_and_composition_pages_render_on_the_site(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from views_dag import build_views_prefix

    built = build_views_prefix(tmp_path / "views")
    SitePublisher(str(built["prefix"]), str(tmp_path / "site")).cycle()
    urls = record_requests(page)
    with static_server(tmp_path / "site") as base:
        page.goto(f"{base}/index.html#/step/{built['paths']['scaling']}")
        ladder_canvas = page.locator('[data-testid=ladder-view] [data-chart="ladder"] canvas')
        expect(ladder_canvas).to_have_count(1, timeout=DEADLINE_MS)
        screenshot(page, "publish-ladder")
        page.goto(f"{base}/index.html#/step/{built['paths']['weights']}")
        expect(page.locator("[data-testid=composition-view]")).to_be_visible(timeout=DEADLINE_MS)
        screenshot(page, "publish-composition")
        page.goto(f"{base}/index.html#/step/{built['paths']['train']}")
        expect(page.locator('[data-testid=run-view] [data-chart="loss"] canvas')).to_have_count(1, timeout=DEADLINE_MS)
        screenshot(page, "publish-tiny-run")
        check_page_builds_the_servers_views(page, built["prefix"], built["paths"]["train"])
    assert all(url.startswith(base + "/") or url.startswith("data:") for url in urls), urls


def element_screenshot(locator: Any, name: str) -> None:
    """A screenshot of one element (a view, a table) beside the dashboard's full-page ones."""
    folder = ARTIFACTS / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(folder / f"{name}.png"))


def check_hero_site(page: Any, prefix: Path, outputs: dict[str, Path], site: Path) -> None:
    """The tiny hero's prefix, published: the experiment, the hero's run view with its prediction, the ladder
    and the composition pages render its data, no alert on its health fires and no request leaves the site."""
    SitePublisher(str(prefix), str(site)).cycle()
    # The demo's runs are healthy: no alert fires but throughput_drop, the one rule read from wall-clock time, which
    # a busy test machine (the other worker's gang, its compiles) can fire on any healthy run.
    alerts = [json.loads(line) for path in prefix.rglob("alerts.jsonl") for line in path.read_text().splitlines()]
    assert all(alert["rule"] == "throughput_drop" for alert in alerts), alerts
    urls = record_requests(page)
    relative = {name: folder.relative_to(prefix).as_posix() for name, folder in outputs.items()}
    with static_server(site) as base:
        page.goto(f"{base}/index.html")
        rows = page.locator("[data-testid=experiments] tbody tr")
        expect(rows.first).to_contain_text("hero_535b.py", timeout=DEADLINE_MS)
        if not alerts:
            expect(page.locator("[data-testid=alert-badge]")).to_have_count(0)
        rows.first.click()
        expect(page.locator("[data-testid=dag] g.node").first).to_be_visible(timeout=DEADLINE_MS)
        screenshot(page, "publish-hero-experiment")
        page.goto(f"{base}/index.html#/step/{relative['train/d6144']}")
        expect(page.locator('[data-testid=run-view] [data-chart="loss"] canvas')).to_have_count(1, timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=prediction-link]")).to_contain_text(relative["scaling/ladder"])
        # The run view's last eval point is the evaluate step's result, on the metric the band was fitted on,
        # and sits against the band as the ladder page says.
        results = json.loads((outputs["evaluate/d6144"] / "results.json").read_text())
        last = page.locator("[data-testid=last-eval]")
        expect(last).to_have_attribute("data-key", "eval/suite/macro_loss", timeout=DEADLINE_MS)
        assert float(last.get_attribute("data-value")) == pytest.approx(results["macro_loss"], rel=0.02)
        verdict = last.get_attribute("data-verdict")
        expect(page.locator("[data-testid=sealed-prediction]")).to_have_attribute("data-before", "true")
        screenshot(page, "publish-hero-run")
        element_screenshot(page.locator('[data-view="run"]'), "publish-hero-run-view")  # the run view alone
        # The hero's own composition view: the mixture's planned share and the share served, per phase and component.
        served = page.locator('[data-view="composition"] [data-testid=eaten-table] td[data-planned]')
        expect(served.first).to_be_visible(timeout=DEADLINE_MS)
        components = page.locator('[data-view="composition"] [data-testid=eaten-table] tr[data-component]').count()
        assert components > 0 and served.count() % components == 0, (served.count(), components)
        expect(served.first).to_contain_text("planned ")
        expect(served.first).to_contain_text(" · served ")
        element_screenshot(page.locator('[data-view="composition"]'), "publish-hero-composition-served")
        page.goto(f"{base}/index.html#/step/{relative['train/d768']}")  # the rung the demo SIGKILLs mid-training
        incidents = page.locator("[data-testid=incidents]")
        # The kill leaves no failure in the history: the rerun's start is the second attempt's (a takeover).
        expect(incidents.locator("tr[data-kind=start]")).to_have_count(2, timeout=DEADLINE_MS)
        expect(incidents.locator("tr[data-kind=success]")).to_have_count(1)
        element_screenshot(incidents, "publish-hero-incidents")
        page.goto(f"{base}/index.html#/step/{relative['scaling/ladder']}")
        ladder_canvas = page.locator('[data-testid=ladder-view] [data-chart="ladder"] canvas')
        expect(ladder_canvas).to_have_count(1, timeout=DEADLINE_MS)
        achieved = page.locator("[data-testid=achieved]")
        expect(achieved).to_contain_text("inside the band" if verdict == "inside" else "outside the band")
        screenshot(page, "publish-hero-ladder")
        page.goto(f"{base}/index.html#/step/{relative['mix/cells']}")
        expect(page.locator("[data-testid=composition-view]")).to_be_visible(timeout=DEADLINE_MS)
        screenshot(page, "publish-hero-composition")
    assert all(url.startswith(base + "/") or url.startswith("data:") for url in urls), urls


