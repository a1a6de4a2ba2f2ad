"""A published site says how fresh it is, survives being copied, and can be opened as the CLI says.

- the publisher's heartbeat (data/site.json) while it watches; a RUNNING step shown stale in Chromium once the
  heartbeat is 3 intervals old (a real running step, tests/support/publish_dag.py's `stalled_run`);
- a prefix copied elsewhere renders the same (the band, read from the scaling step the config names by its old
  absolute path), through the dashboard's views and on its published site;
- `publish` prints a command that serves the folder, which, run, serves the site; a page opened from disk says why
  it cannot read its data instead of "Failed to fetch".
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from band_dag import build_band_prefix
from browser_fixtures import DEADLINE_MS, expect, expect_a_stalled_step_page, screenshot
from publish_dag import build_publish_prefix, running_step
from services import free_port, wait_for_port
from test_publish_browser import static_server

from executor.watch.site.publish import SitePublisher
from executor.watch.training.alerts import read_alerts
from executor.watch.training.run_view import run_view


def test_a_watching_publisher_beats_and_a_one_off_publish_writes_nothing_idle(tmp_path: Path) -> None:
    build_publish_prefix(tmp_path / "prefix")
    now = [1_800_000_000.0]
    watcher = SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site"), clock=lambda: now[0], interval_s=60)
    watcher.cycle()
    first = json.loads((tmp_path / "site" / "data" / "site.json").read_text())
    assert first == {"published_at": "2027-01-15T08:00:00+00:00", "interval_s": 60,
                     "heartbeat": "2027-01-15T08:00:00+00:00"}  # fmt: skip
    now[0] += 60
    idle = watcher.cycle()
    beat = json.loads((tmp_path / "site" / "data" / "site.json").read_text())
    assert beat["published_at"] == first["published_at"] and beat["heartbeat"] == "2027-01-15T08:01:00+00:00"
    assert idle.files_written <= 3  # the heartbeat and its folder's manifest
    once = SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site-once"))
    once.cycle()
    assert once.cycle().files_written == 0
    assert json.loads((tmp_path / "site-once" / "data" / "site.json").read_text())["heartbeat"] is None


def test_a_copied_prefix_keeps_its_band(tmp_path: Path) -> None:
    paths = build_band_prefix(tmp_path / "ran-here", long_steps=10)
    copy = tmp_path / "synced" / "copy"
    shutil.copytree(tmp_path / "ran-here", copy)
    shutil.rmtree(tmp_path / "ran-here")  # the old absolute paths lead nowhere now
    view = run_view(str(copy), str(copy / paths["train/hero"]))
    assert view["prediction_error"] is None and view["prediction"]["source"] == paths["scaling/ladder"]
    assert view["last_eval"]["verdict"] == "inside"
    SitePublisher(str(copy), str(tmp_path / "site")).cycle()
    published = json.loads((tmp_path / "site" / "data" / "step" / paths["train/hero"] / "run.json").read_text())
    assert published["prediction"]["source"] == paths["scaling/ladder"] and published["last_eval"]["band"]


def test_publish_prints_a_command_that_serves_the_site(tmp_path: Path) -> None:
    build_publish_prefix(tmp_path / "prefix")
    command = [
        sys.executable,
        "-m",
        "executor",
        "publish",
        "--prefix",
        str(tmp_path / "prefix"),
        "--to",
        str(tmp_path / "site"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    printed = re.search(r"serve it with: (python -m http\.server .*?)  then open (http://\S+)", result.stdout)
    assert printed, result.stdout
    port = free_port()
    serve = shlex.split(printed.group(1).replace(" 8000 ", f" {port} "))
    assert serve[:3] == ["python", "-m", "http.server"] and printed.group(2) == "http://127.0.0.1:8000/"
    process = subprocess.Popen([sys.executable, *serve[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, "http.server")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/experiments.json", timeout=30) as response:
            assert json.loads(response.read())["experiments"]
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.browser
def test_a_running_step_shows_stale_once_the_publisher_stops(page, tmp_path: Path, fast_leases) -> None:  # type: ignore[no-untyped-def]
    # Lines just written: no stall.
    with running_step(tmp_path / "prefix", "freshness", "train/running", times="now") as (_, relative):
        beat = [time.time() - 3600]  # the watcher's last cycle an hour ago, every minute before that
        publisher = SitePublisher(
            str(tmp_path / "prefix"), str(tmp_path / "site"), clock=lambda: beat[0], interval_s=60
        )
        publisher.cycle()
        with static_server(tmp_path / "site") as base:
            page.goto(f"{base}/index.html")  # the list, its chip and the header's dot say what every page says
            chip = page.locator("[data-testid=experiments] [data-count=RUNNING]")
            expect(chip).to_have_attribute("data-stale", "true", timeout=DEADLINE_MS)
            expect(chip).to_contain_text("RUNNING · stale")
            expect(page.locator("#live")).to_have_attribute("data-state", "stale")
            screenshot(page, "publish-stale-list")
            page.goto(f"{base}/index.html#/step/{relative}")
            expect(page.locator("[data-testid=step-status] [data-stale=true]")).to_have_text(
                "RUNNING · stale", timeout=DEADLINE_MS
            )
            expect(page.locator("#published")).to_contain_text("publisher last seen 1.0 h ago")
            screenshot(page, "publish-stale-running")
            time.sleep(1.1)  # http.server revalidates by Last-Modified, in whole seconds
            beat[0] = time.time()
            publisher.cycle()
            page.reload()
            expect(page.locator("#published")).to_have_attribute("data-stale", "false", timeout=DEADLINE_MS)
            expect(page.locator("[data-testid=step-status] [data-status=RUNNING]")).to_have_text("RUNNING")
            expect(page.locator("#live")).to_have_attribute("data-state", "live")
            page.goto(f"{base}/index.html")
            chip = page.locator("[data-testid=experiments] [data-count=RUNNING]")
            expect(chip).to_have_text("RUNNING 1", timeout=DEADLINE_MS)
            expect(chip).not_to_have_attribute("data-stale", "true")
        page.goto((tmp_path / "site" / "index.html").as_uri())
        expect(page.locator(".error").first).to_contain_text("python -m http.server", timeout=DEADLINE_MS)


@pytest.mark.browser
def test_a_run_that_goes_quiet_is_shown_stalled_on_every_page(page, tmp_path: Path, fast_leases) -> None:  # type: ignore[no-untyped-def]
    """The publisher is alive, the run is not: its last line is 10 minutes old, past its allowance (2 minutes: it
    stepped every second, training/stall_rule.py). The stall fires, and the list's chip, the header's dot, the
    experiment's table and the step page all say "stalled", the step page counting the silence up."""
    with running_step(tmp_path / "prefix", "quiet-run", "train/quiet", quiet_s=600.0, times="now") as (
        output_path,
        relative,
    ):
        publisher = SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site"), interval_s=60)
        assert publisher.cycle().new_alerts == 1
        [alert] = read_alerts(output_path)
        assert (alert["rule"], alert["step"], alert["threshold"]) == ("stalled", 19, 120)
        live = json.loads((tmp_path / "site" / "data/step" / relative / "live.json").read_text())
        assert live["stalled"]["step"] == 19 and live["stalled"]["after_s"] == 120
        with static_server(tmp_path / "site") as base:
            page.goto(f"{base}/index.html")
            chip = page.locator("[data-testid=experiments] [data-count=stalled]")
            expect(chip).to_have_text("stalled 1", timeout=DEADLINE_MS)
            expect(page.locator("#live")).to_have_attribute("data-state", "stalled")
            page.locator("[data-testid=experiments] tbody tr").first.click()
            row = page.locator('[data-testid=steps] tr[data-step="train/quiet"]')
            expect(row.locator("[data-stalled=true]")).to_have_text("RUNNING · stalled", timeout=DEADLINE_MS)
            expect(page.locator("[data-testid=counts] [data-count=stalled]")).to_have_text("stalled 1")
            page.goto(f"{base}/index.html#/step/{relative}")
            expect_a_stalled_step_page(page, "publish-stalled-run")
