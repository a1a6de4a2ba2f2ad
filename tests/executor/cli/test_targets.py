"""`python -m executor` on a target that is not there, or on a store it cannot reach (issue 38 point 6): one
line on stderr naming the path and the likely cause, exit code 2, never a page of gcsfs tracebacks, and (offline)
never the storage layer's minute of retries."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from services import free_port

from executor.cli.commands import main as cli_main


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "executor", *argv], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.parametrize("command", ["status", "explain", "verify"])
def test_a_missing_local_target_is_one_line_on_stderr_and_exit_code_2(tmp_path, capsys, command):
    missing = tmp_path / "no-such-prefix"
    assert cli_main([command, str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"python -m executor {command}: {missing}: nothing is stored there (no such prefix, step output or "
        "bucket); check the path\n"
    )


@pytest.mark.slow
def test_an_unreachable_store_is_one_line_naming_the_path_and_the_cause():
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: what an offline machine gets from the store
    result = cli("status", "gs://no-such-bucket/runs", env={"STORAGE_EMULATOR_HOST": closed, "FSSPEC_GS_TOKEN": "anon"})
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("python -m executor status: gs://no-such-bucket/runs: no answer from its store within 12 s")
    assert "offline, or the store's endpoint is unreachable" in line


@pytest.mark.gcs
def test_a_bucket_that_does_not_exist_is_one_line(gcs_emulator):
    result = cli("status", "gs://no-such-bucket-38/runs")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "python -m executor status: gs://no-such-bucket-38/runs: nothing is stored there (no such prefix, step "
        "output or bucket); check the path"
    ]
    present = cli("status", f"{gcs_emulator}/empty-{os.getpid()}")
    assert present.returncode == 2  # an empty path on a real bucket is nothing stored either


def test_the_store_error_line_says_which_cause():
    from executor.store.probe import explain_store_error

    refused = ConnectionRefusedError(111, "Connect call failed")
    assert "cannot reach its store: offline" in explain_store_error("gs://b/p", refused)
    denied = PermissionError("403 Forbidden: caller does not have storage.objects.list access")
    assert "refused access: no credentials" in explain_store_error("gs://b/p", denied)
