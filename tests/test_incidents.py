"""A run's incidents in public: an injected failure retried by the executor, the resume from a checkpoint that
followed (steps redone), an alert, on the run view's timeline with the goodput, and on the experiment's timeline,
on the published site (the live dashboard draws the same JSON). Not covered here: a gang torn down (its failure
message names the gang member; tests/test_gang.py makes such failures on two local Ray hosts).

The run is a real executor step: its first attempt logs steps 0-29 and loses its connection (a transient
error, retried after a backoff); the second resumes from its step-19 "checkpoint", redoes 20-29 and goes on
to 59, with a loss spike at 50.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser_fixtures import DEADLINE_MS, expect, screenshot
from test_publish_browser import static_server

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.dashboard.publish import SitePublisher
from executor.retry import RetryPolicy
from executor.status import METRICS_FILE

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
    [entry] = json.loads((experiment / "incidents.json").read_text())["timeline"]
    assert (entry["kind"], entry["step_name"], entry["path"]) == ("retry", "train/flaky", flaky["relative"])


@pytest.mark.browser
def test_the_published_run_view_shows_the_timeline(page, flaky) -> None:  # type: ignore[no-untyped-def]
    with static_server(flaky["root"] / "site") as base:
        page.goto(f"{base}/index.html#/step/{flaky['relative']}")
        incidents = page.locator("[data-testid=incidents]")
        expect(incidents.locator("tr[data-kind=retry]")).to_contain_text("ConnectionError", timeout=DEADLINE_MS)
        expect(incidents.locator("tr[data-kind=resume]")).to_contain_text("steps 20-29 redone")
        expect(incidents.locator("[data-testid=goodput]")).to_contain_text("goodput ")
        incidents.scroll_into_view_if_needed()
        screenshot(page, "publish-incidents")
        page.goto(f"{base}/index.html")
        page.locator("[data-testid=experiments] tbody tr").first.click()
        expect(page.locator("[data-testid=experiment-incidents] tr[data-kind=retry]")).to_contain_text(
            "train/flaky", timeout=DEADLINE_MS
        )
        screenshot(page, "publish-experiment-incidents")


def test_a_lost_gang_member_and_a_takeover_are_named() -> None:
    """The history a gang's lost member leaves (executor/gang.py's message, retried as a new gang) and a lease
    taken over from a holder that died without a word."""
    from executor.dashboard.incidents import status_incidents
    from executor.status import StatusEvent, StepStatus

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
