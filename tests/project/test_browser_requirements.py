"""Browser tests skip without Chromium on a workstation but fail under `CI=true` (issue 38 point 9): a CI image
that lost its browser must not pass with every browser test skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from paths import REPO, TESTS

E2E = TESTS / "e2e"


def run_browser_test(ci: bool) -> subprocess.CompletedProcess[str]:
    """One browser test in a pytest of its own, on a PATH without chromium."""
    env = {key: value for key, value in os.environ.items() if key not in ("CHROMIUM", "CI")}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv's tools only: no chromium on it
    if ci:
        env["CI"] = "true"
    test = f"{E2E / 'test_dashboard_browser.py'}::test_failed_step_page_shows_the_error"
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=REPO, env=env)


def test_a_missing_chromium_skips_on_a_workstation_and_fails_under_ci():
    workstation = run_browser_test(ci=False)
    assert workstation.returncode == 0 and "1 skipped" in workstation.stdout, workstation.stdout[-2000:]
    ci = run_browser_test(ci=True)
    assert ci.returncode == 1, ci.stdout[-2000:]
    assert "a chromium binary is missing under CI=true" in ci.stdout and "1 error" in ci.stdout


def test_a_broken_playwright_skips_only_the_browser_tests_never_a_whole_file(tmp_path):
    """Playwright failing on import (a broken install) skips the tests that use a browser, not the other tests of
    their file: the tiny hero's end-to-end file (mostly checks of its run) is still collected whole. Before, a
    module-level skip in the browser tests' module skipped every file that imported its fixtures."""
    broken = tmp_path / "site" / "playwright"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('playwright is broken here')\n")
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(broken.parent), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--collect-only",
               str(E2E / "test_hero_tiny.py")]  # fmt: skip
    collected = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
                               env=env)  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    assert "skipped" not in collected.stdout and "tests collected" in collected.stdout, collected.stdout[-2000:]
    test = f"{E2E / 'test_dashboard_browser.py'}::test_failed_step_page_shows_the_error"
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs", test]
    skipped = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
                             env=env)  # fmt: skip
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    assert "playwright is missing (playwright is broken here" in skipped.stdout, skipped.stdout[-2000:]
