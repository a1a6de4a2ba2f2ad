"""A RUNNING step whose holder is gone says so (issue 38 point 3): after `kill -9` of the executor mid-step, or
once a frozen holder's heartbeat is older than the lease timeout, `status`, `explain` and the dashboard show
"RUNNING - holder lost since T; the next run takes it over" (T: the lease's last heartbeat), and the next run
does take it over. While the holder lives, RUNNING is plain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from executor.cli.commands import main as cli_main
from executor.dag.explain import explain_output
from executor.store.events import StepStatus, read_events
from executor.store.layout import LEASE_DIR
from executor.store.lease import HEARTBEAT_ENV, STALE_ENV
from executor.watch.app import DashboardApp
from executor.watch.site.publish import SitePublisher

EXPERIMENT = """
import time
from dataclasses import dataclass
from pathlib import Path

from executor import THIS_OUTPUT_PATH, ExecutorStep, executor_main, versioned


@dataclass(frozen=True)
class BlockConfig:
    gate: str
    output_path: str


def wait_for_gate(config: BlockConfig) -> None:
    # Blocks while the gate file exists: the run to kill is mid-step for as long as the test needs.
    while Path(config.gate).exists():
        time.sleep(0.05)
    (Path(config.output_path) / "done").write_text("yes")


block = ExecutorStep("slow/step", wait_for_gate, BlockConfig(versioned("GATE"), THIS_OUTPUT_PATH))

if __name__ == "__main__":
    executor_main([block])
"""


@pytest.fixture
def lease_times(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Short lease intervals for the experiment and for this test's readers alike."""
    settings = {HEARTBEAT_ENV: "0.3", STALE_ENV: "2"}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return settings


def start(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    gate = tmp_path / "gate"
    gate.write_text("closed")
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(EXPERIMENT).replace('"GATE"', repr(str(gate))))
    prefix = tmp_path / "outputs"
    process = subprocess.Popen([sys.executable, str(script), "--prefix", str(prefix)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        outputs = list(prefix.glob("slow/step-*"))
        events = read_events(str(outputs[0])) if outputs else []
        if events and events[-1].status == StepStatus.RUNNING and list((outputs[0] / LEASE_DIR).glob("*.json")):
            return process, outputs[0], gate
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"the step never started: {process.communicate()[0]}")


def heartbeat_of(output: Path) -> str:
    [lease] = sorted((output / LEASE_DIR).glob("*.json"))
    return json.loads(lease.read_text())["heartbeat"]


def shown(output: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """What status, explain, the dashboard's step list and its live step view say of the step."""
    prefix = output.parent.parent
    cli_main(["status", str(prefix)])
    status = capsys.readouterr().out
    app = DashboardApp(str(prefix), live_ttl_s=0.0)
    [summary] = json.loads(app.handle("/api/experiments", {}).body)["experiments"]
    [row] = json.loads(app.handle("/api/experiment/steps", {"file": summary["file"]}).body)["rows"]
    live = json.loads(app.handle("/api/step/live", {"path": row["path"]}).body)
    return {"status": status, "explain": explain_output(str(output)).render(), "row": row["message"] or "",
            "live": live["message"] or "", "live_holder_lost": live["holder_lost"] or ""}  # fmt: skip


def site_says(site: Path, output: Path) -> str:
    """The published site's step-list row message and live step message, one per line."""
    [steps] = site.glob("data/experiment/*/steps.json")
    [row] = json.loads(steps.read_text())["rows"]
    live = json.loads((site / "data" / "step" / "slow" / output.name / "live.json").read_text())
    return f"{row['message']}\n{live['message']}"


def test_a_killed_run_shows_holder_lost_everywhere_and_the_next_run_takes_it_over(tmp_path, lease_times, capsys):
    process, output, gate = start(tmp_path)
    site = tmp_path / "site"
    publisher = SitePublisher(str(output.parent.parent), str(site))
    try:
        publisher.cycle()
        assert "holder lost" not in site_says(site, output)
        publisher.cycle()  # what the step's start wrote after the first cycle is published: its folder is settled
        while_live = shown(output, capsys)
        assert all("holder lost" not in text for text in while_live.values()), while_live
        assert "RUNNING" in while_live["status"]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        process.kill()
    expected = f"RUNNING - holder lost since {heartbeat_of(output)}; the next run takes it over"
    after = shown(output, capsys)
    assert f"slow/step-{output.name.split('-')[-1]}: {expected} ({output})" in after["status"]
    assert f"status: {expected}" in after["explain"]
    assert after["row"] == expected and after["live"] == expected
    assert after["live_holder_lost"] == expected.removeprefix("RUNNING - ")
    publisher.cycle()  # nothing in the step's folder changed, yet the site learns that its holder is lost
    assert site_says(site, output) == f"{expected}\n{expected}"
    gate.unlink()
    rerun = subprocess.run([sys.executable, str(tmp_path / "slow.py"), "--prefix", str(tmp_path / "outputs")],
                           capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert "1 taken over" in rerun.stderr and read_events(str(output))[-1].status == StepStatus.SUCCESS


def test_a_frozen_holder_is_lost_once_its_heartbeat_is_older_than_the_lease_timeout(tmp_path, lease_times, capsys):
    process, output, _gate = start(tmp_path)
    try:
        os.kill(process.pid, signal.SIGSTOP)  # alive, on this host, but renewing nothing: as a holder elsewhere
        frozen_at = heartbeat_of(output)
        deadline = time.monotonic() + 60
        # Each view reads the clock on its own, one after another: wait until every one of them has seen the lease
        # go stale (under load, `status` can read it a moment before the timeout and `explain` a moment after).
        after = shown(output, capsys)
        while not all("holder lost" in after[view] for view in ("status", "explain", "row")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
            after = shown(output, capsys)
        expected = f"RUNNING - holder lost since {frozen_at}; the next run takes it over"
        assert f"status: {expected}" in after["explain"] and after["row"] == expected
        assert expected in after["status"]
    finally:
        process.kill()
        process.wait(timeout=60)
