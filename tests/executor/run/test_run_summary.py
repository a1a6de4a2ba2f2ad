"""The run summary counts what this executor did, apart from what another did (issue 38 point 6): two
executors on one prefix, the one that only waited says "0 step(s) ran here, 1 ran by another executor"; one
that waited on a holder that was then killed takes the step over and counts it as "taken over"."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_holder_lost import lease_times, start  # noqa: F401 (lease_times: a fixture, used below)

from executor.store.events import StepStatus, read_events

pytestmark = pytest.mark.usefixtures("lease_times")


def second_executor(tmp_path: Path) -> subprocess.Popen[str]:
    """The same experiment started again on the same prefix, while the first holds the step."""
    command = [sys.executable, str(tmp_path / "slow.py"), "--prefix", str(tmp_path / "outputs")]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_line(process: subprocess.Popen[str], text: str) -> list[str]:
    """Read the process's output up to a line holding `text` (it waits on the lease: it logs so once)."""
    assert process.stdout is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if text in line or not line:
            return lines
    raise AssertionError("".join(lines))


def test_an_executor_that_only_waited_counts_the_step_as_run_by_another(tmp_path):
    first, output, gate = start(tmp_path)
    second = second_executor(tmp_path)
    try:
        waited = wait_for_line(second, "holds the lease")
        assert "holds the lease" in waited[-1], "".join(waited)
        gate.unlink()
        assert first.wait(timeout=120) == 0
        rest = second.communicate(timeout=120)[0]
    finally:
        first.kill()
        second.kill()
    assert "0 step(s) ran here, 1 ran by another executor, 0 were already done" in rest, rest
    assert sum(event.status == StepStatus.RUNNING for event in read_events(str(output))) == 1


def test_a_holder_killed_while_another_waits_is_taken_over_and_counted(tmp_path):
    first, output, gate = start(tmp_path)
    second = second_executor(tmp_path)
    try:
        wait_for_line(second, "holds the lease")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        gate.unlink()
        rest = second.communicate(timeout=120)[0]
    finally:
        first.kill()
        second.kill()
    assert "1 step(s) ran here (1 taken over from a holder that was gone), 0 were already done" in rest, rest
    assert read_events(str(output))[-1].status == StepStatus.SUCCESS
