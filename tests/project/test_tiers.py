"""The suite's tiers (tests/support/tiers.py): markers given from the fixtures a test uses and the folder it is in,
`--quick` keeping only unmarked tests of tests/executor/ and tests/steps/, and a test there that leaves Ray running
failing with the marker it needs. Run on a small suite of its own in a subprocess, as `make test-quick` would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import pytest
pytest_plugins = ["tiers"]

@pytest.fixture
def gcs_emulator():
    return "gs://bucket"

@pytest.fixture(scope="module")
def trained():
    return "a model"
"""

UNIT = """
import sys, types
import pytest

def test_plain():
    pass

def test_on_gcs(gcs_emulator):
    pass

def test_on_a_trained_model(trained):
    pass

@pytest.mark.slow
def test_marked_slow():
    pass

def test_that_leaves_ray_running():
    # A stand-in for ray with a running session: the guard looks at sys.modules["ray"] after the test.
    sys.modules["ray"] = types.SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: None)
"""


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "support")])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rA", *args],
        cwd=folder, env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def small_suite(root: Path) -> Path:
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow\n    gcs\n    training\n    e2e\n")
    (root / "tests" / "executor").mkdir(parents=True)
    (root / "tests" / "e2e").mkdir()
    (root / "tests" / "project").mkdir()
    (root / "tests" / "conftest.py").write_text(CONFTEST)
    (root / "tests" / "executor" / "test_unit.py").write_text(UNIT)
    (root / "tests" / "e2e" / "test_whole.py").write_text("def test_whole_pipeline():\n    pass\n")
    (root / "tests" / "project" / "test_repo.py").write_text("def test_repository():\n    pass\n")
    return root


def selected(done: subprocess.CompletedProcess[str]) -> set[str]:
    return {line.split("::")[-1] for line in done.stdout.splitlines() if line.startswith("tests/")}


def test_fixtures_and_folders_give_their_markers(tmp_path: Path) -> None:
    suite = small_suite(tmp_path)
    assert selected(run_pytest(suite, "--collect-only", "-m", "gcs")) == {"test_on_gcs"}
    assert selected(run_pytest(suite, "--collect-only", "-m", "training")) == {"test_on_a_trained_model"}
    assert selected(run_pytest(suite, "--collect-only", "-m", "e2e")) == {"test_whole_pipeline"}


def test_the_quick_tier_keeps_the_unmarked_unit_tests_and_fails_one_that_leaves_ray_running(tmp_path: Path) -> None:
    suite = small_suite(tmp_path)
    collected = selected(run_pytest(suite, "--collect-only", "--quick"))
    assert collected == {"test_plain", "test_that_leaves_ray_running"}
    done = run_pytest(suite, "--quick")
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 5 deselected" in done.stdout, done.stdout
    assert "test_that_leaves_ray_running started Ray: mark it @pytest.mark.ray" in done.stdout, done.stdout
    everything = run_pytest(suite)  # without --quick the guard is off and every tier runs
    assert "7 passed" in everything.stdout and everything.returncode == 0, everything.stdout
