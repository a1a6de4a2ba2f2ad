"""The cluster config stays valid for Ray's launcher and sends each kind of step to the right nodes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from paths import REPO

ROOT = REPO


CONFIGS = ["gcp.yaml", "gcp_gpu_hero.yaml", "gcp_tpu_hero.yaml"]


@pytest.fixture(scope="module")
def checked() -> tuple[int, dict[str, str], str]:
    """`check_config.py` over every config at once: its exit status, each config's section, stderr."""
    paths = [str(ROOT / "infra" / "cluster" / config) for config in CONFIGS]
    result = subprocess.run([sys.executable, str(ROOT / "infra" / "cluster" / "check_config.py"), *paths],
                            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    sections = dict(zip(CONFIGS, result.stdout.split("== ")[1:], strict=True))
    return result.returncode, sections, result.stderr


@pytest.mark.parametrize("config", CONFIGS)
def test_gcp_cluster_config_passes_the_offline_check(checked, config):
    returncode, sections, stderr = checked
    output = sections[config]
    assert output.startswith(str(ROOT / "infra" / "cluster" / config)), output
    assert returncode == 0, "\n".join(sections.values()) + stderr
    assert "valid for Ray's cluster launcher" in output
    assert "FAIL" not in output
    if config != "gcp.yaml":  # the full hero's multi-host train steps (gangs) each get one host per member
        assert "ok   hero train step" in output and "ok   rung train step" in output


def test_find_python312_finds_a_python_312():
    found = subprocess.run([str(ROOT / "infra" / "find_python312.sh")], capture_output=True, text=True, check=True)
    version = subprocess.run([found.stdout.strip(), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("Python 3.12")
