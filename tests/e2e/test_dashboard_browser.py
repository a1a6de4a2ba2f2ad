"""The dashboard in headless Chromium (Debian's `chromium`, driven by Playwright) on a real DAG's prefix.

Each test saves a screenshot of every page it visits under `$TEST_ARTIFACTS_DIR/dashboard`
(default `build/test-artifacts/dashboard`). Waits poll the DOM with generous deadlines; nothing
asserts on wall-clock time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_fixtures import DEADLINE_MS, expect, expect_a_stalled_step_page, screenshot, served
from publish_dag import running_step
from test_dashboard_api import write_synthetic_prefix
from test_dashboard_dag import GATES, build_prefix, gated_step

from executor import Executor
from executor.store.events import read_status
from executor.watch.server import make_server, serve_in_thread

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dashboard-browser")
    build_prefix(path)
    return path


@pytest.fixture(scope="module")
def base_url(prefix: Path) -> Iterator[str]:
    with served(prefix) as url:
        yield url


def test_experiment_and_step_pages(page, base_url: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(base_url + "/")
    rows = page.locator("[data-testid=experiments] tbody tr")
    expect(rows).to_have_count(2, timeout=DEADLINE_MS)
    expect(rows.first).to_contain_text("lsq.py")
    expect(rows.first.locator("[data-count=FAILED]")).to_contain_text("1")
    screenshot(page, "experiments")

    rows.first.click()
    nodes = page.locator("[data-testid=dag] g.node")
    expect(nodes).to_have_count(6, timeout=DEADLINE_MS)
    expect(page.locator("[data-testid=dag] path.edge")).to_have_count(5)
    expect(page.locator("[data-testid=dag] path.edge.pseudo")).to_have_count(1)
    expect(page.locator('g.node[data-node="data/broken"]')).to_have_attribute("data-status", "FAILED")
    expect(page.locator('g.node[data-node="report/broken"]')).to_have_attribute("data-status", "DEP_FAILED")
    expect(page.locator('g.node[data-node="train/lsq"]')).to_have_attribute("data-status", "SUCCESS")
    counts = page.locator("[data-testid=counts]")
    expect(counts.locator("[data-count=SUCCESS]")).to_contain_text("4")
    expect(counts.locator("[data-count=DEP_FAILED]")).to_contain_text("1")
    expect(page.locator("[data-testid=steps] tbody tr")).to_have_count(6)
    expect(page.locator('tr[data-step="data/raw"] [data-progress]')).to_have_attribute("data-progress", "4/4")
    expect(page.locator('tr[data-step="data/clean"]')).to_contain_text("docs 40 → 30")
    screenshot(page, "experiment")

    page.locator("button.chip[data-count=FAILED]").click()
    expect(page.locator("[data-testid=steps] tbody tr")).to_have_count(1, timeout=DEADLINE_MS)
    expect(page.locator("[data-testid=steps] tbody tr")).to_contain_text("data/broken")
    page.locator("button.chip[data-count=FAILED]").click()
    page.locator("[data-testid=name-filter]").fill("lsq")
    expect(page.locator("[data-testid=steps] tbody tr")).to_have_count(2, timeout=DEADLINE_MS)
    screenshot(page, "experiment-filtered")

    page.locator('tr[data-step="train/lsq"] a').click()
    expect(page.locator("[data-testid=step-status]")).to_have_text("SUCCESS", timeout=DEADLINE_MS)
    expect(page.locator('[data-testid=config] tr[data-key="lr"]')).to_have_attribute("data-kind", "versioned")
    expect(page.locator('[data-testid=config] tr[data-key="input_path"]')).to_have_attribute("data-kind", "dependency")
    expect(page.locator("[data-testid=explain]")).to_contain_text("config.lr: 0.05 there -> 0.1 here")
    expect(page.locator("[data-testid=log]")).to_contain_text("step 0 loss", timeout=DEADLINE_MS)
    expect(page.locator('[data-metric="loss"] canvas')).to_have_count(1, timeout=DEADLINE_MS)
    expect(page.locator("[data-testid=history] tbody tr")).to_have_count(3)
    page.locator('[data-testid=files] tr[data-file="model.json"]').click()
    expect(page.locator("[data-testid=preview]")).to_contain_text("weight", timeout=DEADLINE_MS)
    screenshot(page, "step-train")


def test_failed_step_page_shows_the_error(page, base_url: str, prefix: Path) -> None:  # type: ignore[no-untyped-def]
    broken = next(path.name for path in (prefix / "data").iterdir() if path.name.startswith("broken-"))
    page.goto(f"{base_url}/step/data/{broken}")
    expect(page.locator("[data-testid=step-status]")).to_have_text("FAILED", timeout=DEADLINE_MS)
    expect(page.locator("[data-testid=failure]")).to_contain_text("the broken step always fails")
    screenshot(page, "step-failed")


def wait_for_output_path(executor: Executor, step: object) -> str:
    """The step's output path, once the executor (in another thread) has planned it and marked it RUNNING."""
    for _ in range(600):
        path = executor.output_paths.get(step)  # type: ignore[call-overload]
        if path is not None and read_status(path) == "RUNNING":
            return path
        time.sleep(0.1)
    raise AssertionError("the gated step never started running")


def test_running_step_updates_without_reload(page, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On a prefix of its own: the shared one's experiment counts stay what the other tests expect, whatever the
    order the tests run in (run first on the shared prefix, this test made the experiments page's count 3)."""
    monkeypatch.setenv("EXECUTOR_LEASE_HEARTBEAT_S", "0.2")  # the step log is uploaded on each heartbeat
    step = gated_step("browser-live")
    prefix = tmp_path / "live"
    prefix.mkdir()
    executor = Executor(str(prefix))
    runner = threading.Thread(target=executor.run, args=([step],), kwargs={"caller": "experiments/live.py"})
    runner.start()
    with served(prefix) as base_url:
        check_live_step(page, executor, step, prefix, base_url, runner)


def check_live_step(page, executor: Executor, step, prefix: Path, base_url: str, runner: threading.Thread) -> None:  # type: ignore[no-untyped-def]
    try:
        output_path = wait_for_output_path(executor, step)
        relative = output_path[len(str(prefix)) + 1 :]
        page.goto(f"{base_url}/step/{relative}")
        expect(page.locator("[data-testid=step-status]")).to_have_text("RUNNING", timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=log]")).to_contain_text("waiting for gate", timeout=DEADLINE_MS)
        page.evaluate("window.__notReloaded = true")
        screenshot(page, "step-running")
        assert read_status(output_path) == "RUNNING"
    finally:
        GATES["browser-live"].set()
        runner.join(timeout=60)
    expect(page.locator("[data-testid=step-status]")).to_have_text("SUCCESS", timeout=DEADLINE_MS)
    expect(page.locator("[data-testid=history] tbody tr")).to_have_count(3, timeout=DEADLINE_MS)
    assert page.evaluate("window.__notReloaded") is True
    screenshot(page, "step-finished-live")


def test_big_experiment_draws_groups(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    file = write_synthetic_prefix(tmp_path, 1000)
    server = make_server(str(tmp_path), port=0)
    serve_in_thread(server)
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/experiment/{file}")
        expect(page.locator("[data-testid=dag] g.node")).to_have_count(7, timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=pager]")).to_contain_text("of 1,000")
        page.locator('g.node[data-node="dedup/*"]').click()
        expect(page.locator("[data-testid=pager]")).to_contain_text("of 248", timeout=DEADLINE_MS)
        screenshot(page, "experiment-1000-steps-grouped")
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_gone_quiet_is_stalled_on_every_page_with_no_publisher(page, tmp_path: Path, fast_leases) -> None:  # type: ignore[no-untyped-def]
    """The live dashboard, no publisher running: a RUNNING step's last line is 10 minutes old, past its 2 minutes
    (training/live_stalls.py). The list's chip, the header's dot, the experiment's table and the step page say
    "stalled", the step page counting the silence up."""
    with running_step(tmp_path / "prefix", "dashboard-quiet-browser", "train/quiet", quiet_s=600.0, times="now") as (
        _,
        relative,
    ):
        with served(tmp_path / "prefix") as base_url:
            page.goto(base_url + "/")
            expect(page.locator("[data-testid=experiments] [data-count=stalled]")).to_have_text(
                "stalled 1", timeout=DEADLINE_MS
            )
            expect(page.locator("#live")).to_have_attribute("data-state", "stalled")
            page.locator("[data-testid=experiments] tbody tr").first.click()
            row = page.locator('[data-testid=steps] tr[data-step="train/quiet"]')
            expect(row.locator("[data-stalled=true]")).to_have_text("RUNNING · stalled", timeout=DEADLINE_MS)
            page.goto(f"{base_url}/step/{relative}")
            expect_a_stalled_step_page(page, "dashboard-stalled-run")
