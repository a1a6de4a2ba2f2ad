"""The cluster config stays valid for Ray's launcher and sends each kind of step to the right nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("config", ["gcp.yaml", "gcp_gpu_hero.yaml", "gcp_tpu_hero.yaml"])
def test_gcp_cluster_config_passes_the_offline_check(config):
    result = subprocess.run(
        [sys.executable, str(ROOT / "infra" / "cluster" / "check_config.py"), str(ROOT / "infra" / "cluster" / config)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid for Ray's cluster launcher" in result.stdout
    assert "FAIL" not in result.stdout
    if config != "gcp.yaml":  # the full hero's multi-host train steps (gangs) each get one host per member
        assert "ok   hero train step" in result.stdout and "ok   rung train step" in result.stdout


def test_find_python312_finds_a_python_312():
    found = subprocess.run([str(ROOT / "infra" / "find_python312.sh")], capture_output=True, text=True, check=True)
    version = subprocess.run([found.stdout.strip(), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("Python 3.12")
