"""The hero experiment's own command line (issue 38 point 6): `--help` lists its flags and the executor's,
and `--hosts 0` is refused in one line instead of meaning 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from paths import REPO

HERO = REPO / "experiments" / "hero_535b.py"


def hero(*flags: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HERO), *flags], capture_output=True, text=True, timeout=300,
                          check=False, cwd=cwd)  # fmt: skip


def test_help_lists_the_heros_flags_and_the_executors(tmp_path):
    result = hero("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for flag in ("--scale", "--hardware", "--hosts", "--plan_json", "--check_sources",
                 "--prefix", "--dry_run", "--force_run", "--run_only", "--yes"):  # fmt: skip
        assert flag in result.stdout, flag
    assert not list(tmp_path.iterdir()), "--help wrote something"


def test_hosts_below_one_is_refused_in_one_line(tmp_path):
    for hosts in ("0",):
        result = hero("--hosts", hosts, "--dry_run", "true", "--prefix", str(tmp_path / "out"), cwd=tmp_path)
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if "Error: " in line]
        assert errors == [f"ConfigError: --hosts {hosts}: a step needs at least 1 host; give --hosts 1 or more"]
        assert not (tmp_path / "out").exists()
