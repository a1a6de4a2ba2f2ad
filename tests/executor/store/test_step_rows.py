"""One model of a step's state (executor/store/step_rows.py): `status` and the dashboard say the same of every
history, code drift included, where two copies of the model once disagreed.

The histories are the ones the copies read differently: a SUCCESS whose code changed since (both: drift), a
failure recorded after a SUCCESS with a fingerprint in its details (the old `status` compared with the last event
whatever its status and said drift; the dashboard only on SUCCESS), a forced rerun running over a SUCCESS, a
history that is not JSON (the old `status` raised for the whole table; the dashboard said CORRUPT), and a step
whose code did not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_step

from executor import Executor
from executor.cli.commands import main as cli_main
from executor.store.events import StatusEvent, StepStatus, append_event, parse_events
from executor.store.experiments import read_experiment
from executor.store.layout import STATUS_FILE
from executor.store.step_rows import CORRUPT, StepState, code_drifted, experiment_rows
from executor.watch.app import DashboardApp

NEW_CODE = "f" * 64
"""The fingerprint the newest experiment records for the edited steps: their code changed since they ran."""


def dashboard_rows(prefix: str, experiment: str) -> dict[str, dict]:
    app = DashboardApp(prefix, live_ttl_s=0.0)
    response = app.handle("/api/experiment/steps", {"file": experiment})
    assert response.status == 200, response.body
    return {row["name"]: row for row in json.loads(response.body)["rows"]}


@pytest.fixture
def histories(tmp_path: Path) -> tuple[str, str, dict[str, str]]:
    prefix = str(tmp_path / "outputs")
    names = ["drifted", "failed_after_success", "rerunning", "corrupt", "unchanged"]
    steps = [make_step(name, text=name) for name in names]
    executor = Executor(prefix)
    executor.run(steps)
    path = {name: executor.output_paths[step] for name, step in zip(names, steps, strict=True)}
    recorded = parse_events(Path(path["drifted"], STATUS_FILE).read_bytes(), path["drifted"])[-1]
    fingerprint = recorded.details["code_fingerprint"]
    append_event(
        path["failed_after_success"],
        StatusEvent(StepStatus.FAILED, attempt=2, message="pin mismatch", details={"code_fingerprint": fingerprint}),
    )
    append_event(path["rerunning"], StatusEvent(StepStatus.RUNNING, attempt=2, details={"force_run": True}))
    Path(path["corrupt"], STATUS_FILE).write_text("{not json\n")
    record = read_experiment(executor.executor_info_path)
    for step in record["steps"]:
        if step["name"] != "unchanged":
            step["code_fingerprint"] = NEW_CODE
    Path(executor.executor_info_path).write_text(json.dumps(record))
    return prefix, executor.executor_info_path, path


def test_status_and_the_dashboard_say_the_same_of_every_history(histories, capsys) -> None:  # type: ignore[no-untyped-def]
    prefix, experiment, path = histories
    rows = {row.name: row for row in experiment_rows(read_experiment(experiment))}
    shown = dashboard_rows(prefix, Path(experiment).name)
    said = {name: (row.status, row.drift) for name, row in rows.items()}
    assert said == {
        "drifted": ("SUCCESS", True),
        "failed_after_success": ("FAILED", False),
        "rerunning": ("RUNNING", False),
        "corrupt": (CORRUPT, False),
        "unchanged": ("SUCCESS", False),
    }
    assert {name: (row["status"], row["drift"]) for name, row in shown.items()} == said
    assert rows["corrupt"].state.message == shown["corrupt"]["message"]
    assert (
        "is corrupt" in shown["corrupt"]["message"] and "delete it to let the step rerun" in shown["corrupt"]["message"]
    )

    assert cli_main(["status", experiment]) == 1  # the FAILED step
    out = capsys.readouterr().out
    assert out.count("code drift!") == 1 and CORRUPT in out
    assert cli_main(["status", path["corrupt"]]) == 1  # a corrupt history alone is worth an exit code too
    assert cli_main(["status", path["unchanged"]]) == 0


def test_drift_needs_both_fingerprints_and_a_success() -> None:
    assert code_drifted("a" * 64, "b" * 64)
    assert not code_drifted("a" * 64, "a" * 64)
    assert not code_drifted(None, "b" * 64) and not code_drifted("a" * 64, None)
    success = StatusEvent(StepStatus.SUCCESS, attempt=1, details={"code_fingerprint": "a" * 64})
    assert StepState.of([success]).drifted("b" * 64)
    failed = StatusEvent(StepStatus.FAILED, attempt=2, details={"code_fingerprint": "a" * 64})
    assert not StepState.of([success, failed]).drifted("b" * 64)
    assert StepState.read(None, "/nowhere").status is None
