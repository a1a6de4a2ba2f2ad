"""A run's incidents in public: an injected failure retried by the executor, the resume from a checkpoint that
followed (steps redone), an alert, on the run view's timeline with the goodput, and on the experiment's timeline,
on the published site (the live dashboard draws the same JSON); code drift after a rerun whose step function
was edited; a real gang (tests/support/gang_steps.py's counted sum on a local Ray) whose member is SIGKILLed, torn down,
restarted and resumed.

The run is a real executor step: its first attempt logs steps 0-29 and loses its connection (a transient
error, retried after a backoff); the second resumes from its step-19 "checkpoint", redoes 20-29 and goes on
to 59, with a loss spike at 50.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import test_gang as gang_tests
from browser_fixtures import DEADLINE_MS, expect, screenshot
from test_gang import counted_step, counted_total
from test_publish_browser import static_server

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.retry import RetryPolicy
from executor.store.events import read_events
from executor.store.layout import GANG_FILE, METRICS_FILE
from executor.store.processes import is_running
from executor.watch import files
from executor.watch.app import DashboardApp
from executor.watch.incidents import run_incidents
from executor.watch.site.publish import SitePublisher
from executor.watch.training.alerts import read_alerts

local_ray = gang_tests.local_ray  # the gang tests' local Ray (module scoped)
SECONDS_A_STEP = 0.02


@dataclass(frozen=True)
class FlakyRunConfig:
    output_path: str
    steps: int = versioned(60)


def flaky_run(config: FlakyRunConfig) -> None:
    metrics = Path(config.output_path, METRICS_FILE)
    resumed = metrics.exists()
    first = 20 if resumed else 0
    with metrics.open("a") as handle:
        for step in range(first, 30 if not resumed else config.steps):
            time.sleep(SECONDS_A_STEP)
            loss = 4.0 - step / 100 + (8.0 if resumed and step == 50 else 0.0)
            handle.write(json.dumps({"step": step, "time": time.time(), "train/loss": loss}) + "\n")
            handle.flush()
    if not resumed:
        raise ConnectionError("lost the connection to the data loader's host")


@pytest.fixture(scope="module")
def flaky(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    root = tmp_path_factory.mktemp("incidents")
    step = ExecutorStep(name="train/flaky", fn=flaky_run, config=FlakyRunConfig(THIS_OUTPUT_PATH),
                        retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.2))  # fmt: skip
    executor = Executor(str(root / "prefix"))
    executor.run([step], caller="experiments/flaky.py")
    SitePublisher(str(root / "prefix"), str(root / "site")).cycle()
    relative = Path(executor.output_paths[step]).relative_to(root / "prefix").as_posix()
    return {"root": root, "relative": relative}


def test_the_timeline_holds_the_failure_the_retry_the_resume_and_the_alert(flaky) -> None:  # type: ignore[no-untyped-def]
    run = json.loads((flaky["root"] / "site/data/step" / flaky["relative"] / "run.json").read_text())
    timeline = run["incidents"]["timeline"]
    kinds = [entry["kind"] for entry in timeline]
    assert kinds.count("start") == 2 and kinds.count("success") == 1
    [retry] = [entry for entry in timeline if entry["kind"] == "retry"]
    assert "ConnectionError: lost the connection" in retry["text"] and retry["attempt"] == 1
    [resume] = [entry for entry in timeline if entry["kind"] == "resume"]
    assert (resume["step"], resume["redone"]) == (20, 10)
    assert [entry["text"].split(":")[0] for entry in timeline if entry["kind"] == "alert"] == ["loss_spike"]
    good = run["incidents"]["goodput"]
    assert 0 < good["goodput"] < 1
    assert good["lost_s"]["redone after a resume"] > 0 and good["lost_s"]["between attempts (failures, restarts)"] > 0
    assert good["advancing_s"] + sum(good["lost_s"].values()) == pytest.approx(good["wall_s"])
    [experiment] = (flaky["root"] / "site/data/experiment").iterdir()
    entries = json.loads((experiment / "incidents.json").read_text())["timeline"]
    assert [(entry["kind"], entry["step_name"], entry["path"]) for entry in entries] == [
        ("retry", "train/flaky", flaky["relative"]),
        ("resume", "train/flaky", flaky["relative"]),
    ]  # the resume too
    assert entries[1]["text"].startswith("resumed at step 20 from a checkpoint: steps 20-29 redone, after a failure")
    live = json.loads((flaky["root"] / "site/data/step" / flaky["relative"] / "live.json").read_text())
    first, second = live["attempt_history"]
    assert (first["attempt"], first["outcome"], second["attempt"], second["outcome"]) == (1, "retried", 2, "succeeded")
    assert first["started"] < first["ended"] <= second["started"] < second["ended"]
    assert "ConnectionError: lost the connection" in first["cause"] and second["cause"] is None


@pytest.mark.browser
def test_the_published_run_view_shows_the_timeline(page, flaky) -> None:  # type: ignore[no-untyped-def]
    with static_server(flaky["root"] / "site") as base:
        page.goto(f"{base}/index.html#/step/{flaky['relative']}")
        incidents = page.locator("[data-testid=incidents]")
        expect(incidents.locator("tr[data-kind=retry]")).to_contain_text("ConnectionError", timeout=DEADLINE_MS)
        expect(incidents.locator("tr[data-kind=resume]")).to_contain_text("steps 20-29 redone")
        expect(incidents.locator("[data-testid=goodput]")).to_contain_text("goodput ")
        attempts = page.locator("[data-testid=attempts]")
        expect(attempts.locator("tr[data-outcome=retried]")).to_contain_text("ConnectionError: lost the connection")
        expect(attempts.locator("tr[data-outcome=succeeded]")).to_have_attribute("data-attempt", "2")
        incidents.scroll_into_view_if_needed()
        screenshot(page, "publish-incidents")
        page.goto(f"{base}/index.html")
        page.locator("[data-testid=experiments] tbody tr").first.click()
        expect(page.locator("[data-testid=experiment-incidents] tr[data-kind=retry]")).to_contain_text(
            "train/flaky", timeout=DEADLINE_MS
        )
        expect(page.locator("[data-testid=experiment-incidents] tr[data-kind=resume]")).to_contain_text("steps 20-29")
        screenshot(page, "publish-experiment-incidents")


def test_a_lost_gang_member_and_a_takeover_are_named() -> None:
    """The history a gang's lost member leaves (executor/run/gang.py's message, retried as a new gang) and a lease
    taken over from a holder that died without a word."""
    from executor.store.events import StatusEvent, StepStatus
    from executor.watch.incidents import attempt_history, status_incidents

    lost = (
        "attempt 1 failed (transient): GangMemberLostError: train/hero: gang member 1 of 2 (pid 4242 on 10.0.0.7) "
        "stopped heartbeating; the gang is torn down and the attempt retried as a new gang from the latest checkpoint"
    )
    events = [
        StatusEvent(StepStatus.RUNNING, time="2026-01-01T00:00:00+00:00", attempt=1, lease=0),
        StatusEvent(StepStatus.WAITING, time="2026-01-01T00:10:00+00:00", attempt=1, message=lost, lease=0),
        StatusEvent(StepStatus.RUNNING, time="2026-01-01T00:11:00+00:00", attempt=2, lease=0),
        StatusEvent(StepStatus.RUNNING, time="2026-01-01T01:00:00+00:00", attempt=3, lease=1),
        StatusEvent(StepStatus.SUCCESS, time="2026-01-01T02:00:00+00:00", attempt=3, lease=1),
    ]
    kinds = [entry["kind"] for entry in status_incidents(events)]
    assert kinds == ["start", "gang", "start", "takeover", "start", "success"]
    heartbeats = {0: "2026-01-01T00:58:30+00:00"}  # lease 0's last renewal before its holder died
    history = attempt_history(events, heartbeats.get)
    assert [(entry["attempt"], entry["outcome"]) for entry in history] == [
        (1, "retried"),
        (2, "lost"),
        (3, "succeeded"),
    ]
    assert history[0]["ended"] == "2026-01-01T00:10:00+00:00" and "gang member 1 of 2" in history[0]["cause"]
    assert history[1]["ended"] == heartbeats[0]  # the death of attempt 2 has an entry: last seen, and who took over
    assert history[1]["cause"].endswith("attempt 3 took over at 2026-01-01T01:00:00+00:00")
    assert history[2]["ended"] == "2026-01-01T02:00:00+00:00" and history[2]["cause"] is None


DRIFTING_MODULE = """
import json
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DriftingRunConfig:
    output_path: str


def drifting_run(config: DriftingRunConfig) -> None:
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    with Path(config.output_path, "metrics.jsonl").open("w") as handle:
        for step in range(5):
            handle.write(json.dumps({"step": step, "time": time.time(), "train/loss": LOSS}) + "\\n")
"""


def load_drifting_module(source: Path, loss: str) -> Any:
    """(Re)write the step's module with `loss` as the loss expression and import it afresh. A rewrite of a
    different length, so that neither the bytecode cache nor linecache (what the code fingerprint reads) can
    take the new file for the old one."""
    source.write_text(DRIFTING_MODULE.replace("LOSS", loss))
    spec = importlib.util.spec_from_file_location("drifting_steps", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drifting_step(module: Any) -> ExecutorStep:
    config = module.DriftingRunConfig(THIS_OUTPUT_PATH)
    return ExecutorStep(name="train/drifting", fn=module.drifting_run, config=config)


@pytest.fixture(scope="module")
def drifted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run, published; its step function's body edited (a real code change, not a comment); the experiment
    rerun (the step skipped: code is not hashed) and published again by the same watching publisher."""
    root = tmp_path_factory.mktemp("drift")
    source = root / "drifting_steps.py"
    prefix, site = str(root / "prefix"), str(root / "site")
    first = Executor(prefix)
    first.run([drifting_step(load_drifting_module(source, "4.0 - step / 10"))], caller="experiments/drifting.py")
    publisher = SitePublisher(prefix, site)
    publisher.cycle()
    [output_path] = first.output_paths.values()
    relative = Path(output_path).relative_to(root / "prefix").as_posix()
    before = json.loads((root / "site/data/step" / relative / "run.json").read_text())
    rerun = Executor(prefix)
    rerun.run([drifting_step(load_drifting_module(source, "4.0 - step / 20.0"))], caller="experiments/drifting.py")
    assert list(rerun.output_paths.values()) == [output_path]  # the same hash: the rerun skipped the step
    publisher.cycle()
    return {"root": root, "relative": relative, "before": before, "output_path": output_path}


def test_a_rerun_after_a_code_change_puts_code_drift_on_the_run_and_experiment_timelines(drifted) -> None:  # type: ignore[no-untyped-def]
    site = drifted["root"] / "site/data"
    assert [entry["kind"] for entry in drifted["before"]["incidents"]["timeline"]] == ["start", "success"]
    run = json.loads((site / "step" / drifted["relative"] / "run.json").read_text())
    [drift] = [entry for entry in run["incidents"]["timeline"] if entry["kind"] == "code_drift"]
    assert run["incidents"]["timeline"][-1] == drift  # dated by the rerun's experiment, after the SUCCESS
    status = [json.loads(line) for line in Path(drifted["output_path"], ".executor_status").read_text().splitlines()]
    [success] = [event for event in status if event["status"] == "SUCCESS"]
    recorded = success["details"]["code_fingerprint"]
    [experiment_file] = (drifted["root"] / "prefix/experiments").iterdir()
    [planned] = json.loads(experiment_file.read_text())["steps"]
    assert (drift["recorded"], drift["current"]) == (recorded, planned["code_fingerprint"])
    assert recorded != drift["current"]
    assert drift["fn"] == "drifting_steps:drifting_run" and drift["experiment"] == experiment_file.name
    assert f"fingerprint {recorded[:12]} -> {planned['code_fingerprint'][:12]}" in drift["text"]
    assert "--force_run train/drifting" in drift["text"] and "drifting_steps:drifting_run changed" in drift["text"]
    [entry] = json.loads((site / "experiment" / experiment_file.name / "incidents.json").read_text())["timeline"]
    assert (entry["kind"], entry["step_name"], entry["path"]) == ("code_drift", "train/drifting", drifted["relative"])
    assert entry["text"] == drift["text"]


@pytest.mark.browser
def test_the_published_pages_show_the_code_drift(page, drifted) -> None:  # type: ignore[no-untyped-def]
    with static_server(drifted["root"] / "site") as base:
        page.goto(f"{base}/index.html#/step/{drifted['relative']}")
        row = page.locator("[data-testid=incidents] tr[data-kind=code_drift]")
        expect(row).to_contain_text("code drift", timeout=DEADLINE_MS)
        expect(row).to_contain_text("drifting_steps:drifting_run changed since this output was written")
        page.goto(f"{base}/index.html")
        page.locator("[data-testid=experiments] tbody tr").first.click()
        expect(page.locator("[data-testid=experiment-incidents] tr[data-kind=code_drift]")).to_contain_text(
            "train/drifting", timeout=DEADLINE_MS
        )
        screenshot(page, "publish-code-drift")


def kill_member_once_past_a_checkpoint(prefix: Path, seen: dict[str, Any]) -> None:
    """SIGKILL member 1 of the running gang once process 0 has checkpointed iteration 3 (`state.json` says 3
    done) and logged iteration 4: the retried gang must redo iteration 4 from that checkpoint."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        gang_files = list(prefix.glob(f"gang/killed-*/{GANG_FILE}"))
        if gang_files:
            folder = gang_files[0].parent
            gang = json.loads(gang_files[0].read_text() or "{}")
            state = json.loads((folder / "state.json").read_text()) if (folder / "state.json").exists() else {}
            lines = (folder / METRICS_FILE).read_text().splitlines() if (folder / METRICS_FILE).exists() else []
            logged = {json.loads(line)["step"] for line in lines if line.endswith("}")}
            if gang.get("state") == "running" and state.get("done") == 3 and 4 in logged:
                seen["pid"], seen["started"] = gang["members"][1]["pid"], gang["members"][1]["started"]
                os.kill(seen["pid"], signal.SIGKILL)
                return
        time.sleep(0.02)
    seen["error"] = AssertionError(f"no gang under {prefix} reached iteration 4 within 300 s")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_gang_member_killed_shows_the_teardown_the_restart_and_the_resume(tmp_path, local_ray) -> None:  # type: ignore[no-untyped-def]
    """A 2-host counted-sum gang on a local Ray (tests/support/gang_steps.py), checkpointed every 3 iterations, whose
    member 1 is SIGKILLed after iteration 4: the timeline built from what the executor and the step wrote (the
    status history, metrics.jsonl) shows the gang torn down with the lost member named, the restart after it
    and the resume from the checkpoint with the iteration redone, on the run's and the experiment's timeline."""
    executor, step = counted_step(tmp_path, "gang/killed", iterations=8, pace_s=0.5, checkpoint_every=3, metrics=True)
    seen: dict[str, Any] = {}
    killer = threading.Thread(target=kill_member_once_past_a_checkpoint, args=(tmp_path, seen), daemon=True)
    killer.start()
    executor.run([step], caller="experiments/gang_killed.py")
    killer.join(timeout=10)
    assert "error" not in seen and "pid" in seen, seen
    output_path = executor.output_paths[step]
    assert json.loads(Path(output_path, "result.json").read_text()) == {"done": 8, "total": counted_total(8)}
    assert not is_running(seen["pid"], seen["started"])

    events = read_events(output_path)
    lines = files.metrics_records(str(Path(output_path, METRICS_FILE))) or []
    timeline = run_incidents(events, lines, read_alerts(output_path), None)["timeline"]
    assert [entry["kind"] for entry in timeline] == ["start", "gang", "start", "resume", "success"], timeline
    _, teardown, restart, resume, _ = timeline
    assert "GangMemberLostError" in teardown["text"] and "the gang is torn down" in teardown["text"]
    assert f"gang member 1 of 2 (pid {seen['pid']} on " in teardown["text"] and ") died" in teardown["text"]
    assert (teardown["attempt"], restart["attempt"]) == (1, 2)
    assert restart["after"].startswith("a gang teardown (attempt 1 failed (transient): GangMemberLostError: ")
    assert restart["after"] in restart["text"]
    assert (resume["step"], resume["redone"]) == (3, 2)  # iterations 3 and 4: logged by both gangs
    assert resume["after"] == restart["after"] and "steps 3-4 redone" in resume["text"]

    app = DashboardApp(str(tmp_path))
    [experiment] = json.loads(app.handle("/api/experiments", {}).body)["experiments"]
    answer = json.loads(app.handle("/api/experiment/incidents", {"file": experiment["file"]}).body)
    # The experiment's timeline: the teardown, and the resume that followed it (its text names what it followed).
    entries = sorted(answer["timeline"], key=lambda entry: entry["kind"] != "gang")
    kinds = [(entry["kind"], entry["step_name"]) for entry in entries]
    assert kinds == [("gang", "gang/killed"), ("resume", "gang/killed")], entries
    assert entries[0]["text"] == teardown["text"] and entries[1]["text"] == resume["text"]


def test_goodput_counts_an_eval_line_at_the_step_just_logged_as_evaluating_not_redone() -> None:
    """Levanter logs its evals on lines of their own at the train step's number: the time to such a line is
    the eval's, not steps redone after a resume (the tiny hero's killed rung showed 53 s "redone" without one).
    A line of the same step that is no eval (its throughput) is the step's own time, and the time from the last
    line to SUCCESS is the final checkpoint and export, not a restart."""
    from executor.store.events import StatusEvent, StepStatus
    from executor.watch.incidents import goodput, resumes

    events = [StatusEvent(StepStatus.RUNNING, time="2026-01-01T00:00:00+00:00", attempt=1, lease=0),
              StatusEvent(StepStatus.SUCCESS, time="2026-01-01T00:00:10+00:00", attempt=1, lease=0)]  # fmt: skip
    start = 1767225600.0  # 2026-01-01T00:00:00+00:00
    lines = [{"step": 0, "time": start + 1}, {"step": 1, "time": start + 2},
             {"step": 1, "time": start + 2.5, "throughput/tokens_per_second": 9.0},
             {"step": 1, "time": start + 5, "eval/macro_loss": 3.0}, {"step": 2, "time": start + 6}]  # fmt: skip
    assert resumes(lines) == []
    good = goodput(events, lines)
    assert good is not None and good["advancing_s"] == pytest.approx(2.5)
    assert good["lost_s"]["redone after a resume"] == 0.0
    assert good["lost_s"]["evaluating"] == pytest.approx(2.5)
    assert good["lost_s"]["starting (compile, restore)"] == pytest.approx(1.0)
    assert good["lost_s"]["finishing (final checkpoint, export)"] == pytest.approx(4.0)
    assert good["lost_s"]["between attempts (failures, restarts)"] == pytest.approx(0.0)
    assert good["wall_s"] == pytest.approx(10.0)
