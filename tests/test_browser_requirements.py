"""Browser tests skip without Chromium on a workstation but fail under `CI=true` (issue 38 point 9): a CI image
that lost its browser must not pass with every browser test skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def run_browser_test(ci: bool) -> subprocess.CompletedProcess[str]:
    """One browser test in a pytest of its own, on a PATH without chromium."""
    env = {key: value for key, value in os.environ.items() if key not in ("CHROMIUM", "CI")}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv's tools only: no chromium on it
    if ci:
        env["CI"] = "true"
    test = f"{TESTS / 'test_dashboard_browser.py'}::test_failed_step_page_shows_the_error"
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=TESTS.parent, env=env)


def test_a_missing_chromium_skips_on_a_workstation_and_fails_under_ci():
    workstation = run_browser_test(ci=False)
    assert workstation.returncode == 0 and "1 skipped" in workstation.stdout, workstation.stdout[-2000:]
    ci = run_browser_test(ci=True)
    assert ci.returncode == 1, ci.stdout[-2000:]
    assert "a chromium binary is missing under CI=true" in ci.stdout and "1 error" in ci.stdout
