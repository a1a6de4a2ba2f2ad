"""The cluster config stays valid for Ray's launcher and sends each kind of step to the right nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gcp_cluster_config_passes_the_offline_check():
    result = subprocess.run(
        [sys.executable, str(ROOT / "infra" / "cluster" / "check_config.py")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid for Ray's cluster launcher" in result.stdout
    assert "FAIL" not in result.stdout


def test_find_python312_finds_a_python_312():
    found = subprocess.run([str(ROOT / "infra" / "find_python312.sh")], capture_output=True, text=True, check=True)
    version = subprocess.run([found.stdout.strip(), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("Python 3.12")
