"""The browser tests' Chromium and page fixtures (a pytest plugin, registered in conftest.py), and what they share.

Chromium is Debian's `chromium` (or `$CHROMIUM`), driven by Playwright; never `playwright install`. Without
Playwright or Chromium a browser test is skipped on a workstation and fails under `CI=true`; only the tests that
ask for the `browser` or `page` fixture are affected, never the other tests of their file. Screenshots go under
`$TEST_ARTIFACTS_DIR/dashboard` (default `build/test-artifacts/dashboard`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest
from paths import REPO

from executor.watch.server import make_server, serve_in_thread

DEADLINE_MS = 30_000
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR") or REPO / "build" / "test-artifacts")

try:
    import playwright.sync_api as playwright_sync
except ImportError as error:  # a broken install too: the error says which
    playwright_sync: ModuleType | None = None  # type: ignore[no-redef]
    PLAYWRIGHT_ERROR = str(error)


def require(what: str, how: str) -> NoReturn:
    """Without `what` a browser test is skipped on a workstation; under `CI=true` it fails, so a CI image that
    lost Chromium or Playwright is seen instead of passing with every browser test skipped."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing under CI=true: {how}", pytrace=False)
    pytest.skip(f"{what} is missing ({how})")


def chromium_binary() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def expect(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Playwright's `expect` (only called from a test that got the `page` fixture, so Playwright is there)."""
    assert playwright_sync is not None
    return playwright_sync.expect(*args, **kwargs)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if playwright_sync is None:
        require("playwright", f"{PLAYWRIGHT_ERROR}; pip install playwright (make install)")
    binary = chromium_binary()
    if binary is None:
        require("a chromium binary", "apt-get install -y chromium, or set CHROMIUM; .ci/run installs it")
    with playwright_sync.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=binary, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    """A fresh page that fails its test on any JavaScript error."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


@contextlib.contextmanager
def served(prefix: Path | str) -> Iterator[str]:
    """The dashboard of `prefix` on a free local port; its base URL."""
    server = make_server(str(prefix), port=0, live_ttl_s=0.1)
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def screenshot(page: object, name: str) -> None:
    folder = ARTIFACTS / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]


def expect_a_stalled_step_page(page: object, shot: str) -> None:
    """The step page of the shared quiet run (publish_dag.running_step, quiet 10 minutes past a 2-minute
    allowance) says it is stalled, as the live dashboard and the published site both must: the status badge, the
    stall's text counting the silence up, and the header's dot."""
    status = page.locator("[data-testid=step-status] [data-stalled=true]")  # type: ignore[attr-defined]
    expect(status).to_have_text("RUNNING · stalled", timeout=DEADLINE_MS)
    stalled = page.locator("[data-testid=stalled]")  # type: ignore[attr-defined]
    expect(stalled).to_contain_text("no metrics line for 10 min")
    expect(stalled).to_contain_text("since step 19 (a stall after 2 min 0 s without one")
    expect(page.locator("#live")).to_have_attribute("data-state", "stalled")  # type: ignore[attr-defined]
    counted = stalled.locator("[data-counting]").text_content()
    expect(stalled.locator("[data-counting]")).not_to_have_text(counted or "")  # it counts up
    screenshot(page, shot)
