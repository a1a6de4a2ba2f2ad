"""Forks and rollbacks as steps: a tiny real Levanter run, and a fork of it at a checkpoint with a lower LR.

The fork is its own content-hashed step (`fork_of`), starts from the parent's checkpoint (its first loss is
the parent's at that step: same weights, same batch, the new learning rate not applied yet), records its
lineage, and its run view draws the parent's curve up to the fork. A fork of a step the parent never
checkpointed is refused before any compute, naming the path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import browser_fixtures as browser_tests
import pytest
from browser_fixtures import DEADLINE_MS, expect
from test_publish_browser import check_page_builds_the_servers_views, static_server
from test_train import build_data, train_config, train_losses

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.cli.wandb_sync import offline_runs
from executor.errors import StepFailedError
from executor.store.events import read_status
from executor.store.layout import LINEAGE_FILE, METRICS_FILE
from executor.watch.app import DashboardApp
from executor.watch.site.publish import SitePublisher
from experiments.train_defaults import fork_of
from steps.train.train import train

pytestmark = [pytest.mark.slow, pytest.mark.training, pytest.mark.timeout(1500)]
STEPS = 8
FORK_AT = 4


def metrics(output_path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(output_path, METRICS_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = build_data(tmp_path_factory.mktemp("fork-data"))
    prefix = tmp_path_factory.mktemp("fork-prefix")
    config = train_config(data, THIS_OUTPUT_PATH, num_train_steps=STEPS, checkpoint_every_steps=FORK_AT,
                          steps_per_eval=STEPS, temporary_checkpoint_seconds=3600.0, hf_export=False,
                          learning_rate=versioned(1e-2))  # fmt: skip
    parent = ExecutorStep(name="train/parent", fn=train, config=config)
    fork = fork_of(parent, step=FORK_AT, name="train/fork", learning_rate=versioned(1e-4))
    executor = Executor(str(prefix))
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("WANDB_MODE")  # wandb as shipped (tests/conftest.py): the runs' offline records are read below
        executor.run([parent, fork])
    return {"prefix": prefix, "executor": executor, "parent": parent, "fork": fork}


def test_a_fork_starts_from_the_parents_checkpoint(runs) -> None:
    executor = runs["executor"]
    parent_path, fork_path = executor.output_paths[runs["parent"]], executor.output_paths[runs["fork"]]
    assert parent_path != fork_path and Path(fork_path).name.startswith("fork-")
    parent_losses = dict(train_losses(metrics(parent_path)))
    fork_losses = train_losses(metrics(fork_path))
    first_step, first_loss = fork_losses[0]
    assert first_step > FORK_AT - 1 and first_step in parent_losses  # it went on from the checkpoint, not from 0
    assert first_loss == pytest.approx(parent_losses[first_step], abs=1e-5)
    later_step, later_loss = fork_losses[-1]
    assert abs(later_loss - parent_losses[later_step]) > 1e-6  # the lower learning rate took effect
    lineage = json.loads(Path(fork_path, LINEAGE_FILE).read_text())
    assert lineage == {
        "parent": parent_path,
        "step": FORK_AT,
        "checkpoint": f"{parent_path}/checkpoints/step-{FORK_AT}",
    }


def test_the_run_view_draws_the_parent_up_to_the_fork(runs) -> None:
    prefix, executor = runs["prefix"], runs["executor"]
    relative = executor.output_paths[runs["fork"]][len(str(prefix)) + 1 :]
    response = DashboardApp(str(prefix)).handle("/api/step/run", {"path": relative})
    view = json.loads(response.body)
    assert view["lineage"]["step"] == FORK_AT and view["lineage"]["parent"].startswith("train/parent-")
    loss = view["charts"][0]
    labels = [series["label"] for series in loss["series"]]
    parent = loss["series"][labels.index("parent train/loss")]
    steps = [x for x, value in zip(loss["x"], parent["values"], strict=True) if value is not None]
    assert steps and max(steps) <= FORK_AT


def test_a_fork_of_a_missing_checkpoint_is_refused_naming_it(runs) -> None:
    fork = fork_of(runs["parent"], step=FORK_AT + 1, name="train/bad-fork")
    executor = Executor(str(runs["prefix"]))
    with pytest.raises(StepFailedError):
        executor.run([fork])
    output_path = executor.output_paths[fork]
    assert read_status(output_path) == "FAILED"
    log = Path(output_path, ".executor_status").read_text()
    assert f"checkpoints/step-{FORK_AT + 1} is not a complete checkpoint" in log


def wandb_run_bytes(output_path: str) -> bytes:
    """The offline wandb run's record file (protobuf: config values and fork_from appear as plain text)."""
    [run] = offline_runs(output_path)
    return b"".join(path.read_bytes() for path in Path(run).glob("*.wandb"))


def test_the_wandb_runs_name_their_step_and_the_fork_names_its_parent(runs) -> None:
    executor = runs["executor"]
    parent_path, fork_path = executor.output_paths[runs["parent"]], executor.output_paths[runs["fork"]]
    parent_run, fork_run = wandb_run_bytes(parent_path), wandb_run_bytes(fork_path)
    assert b"executor/step" in parent_run and b"train/parent" in parent_run and parent_path.encode() in parent_run
    fork_hash = json.loads(Path(fork_path, ".executor_info").read_text())["hash"]
    assert fork_hash.encode() in fork_run and b"train/fork" in fork_run
    assert f"{Path(parent_path).name}?_step={FORK_AT}".encode() in fork_run  # wandb's fork_from


def test_wandb_sync_says_what_failed(runs, tmp_path: Path) -> None:
    fork_path = runs["executor"].output_paths[runs["fork"]]
    env = {**os.environ, "WANDB_API_KEY": "", "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_MODE": "online"}
    command = [sys.executable, "-m", "executor", "wandb-sync"]
    offline = subprocess.run([*command, fork_path], capture_output=True, text=True, env=env, timeout=600)
    assert offline.returncode == 2 and "Traceback" not in offline.stderr
    assert "wandb sync of" in offline.stderr and fork_path in offline.stderr
    empty = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert empty.returncode == 2 and f"no offline wandb run under {tmp_path}/wandb/wandb" in empty.stderr




@pytest.mark.browser
def test_the_published_run_view_shows_the_fork_and_its_parent(runs, page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prefix, executor = runs["prefix"], runs["executor"]
    SitePublisher(str(prefix), str(tmp_path / "site")).cycle()
    relative = executor.output_paths[runs["fork"]][len(str(prefix)) + 1 :]
    with static_server(tmp_path / "site") as base:
        page.goto(f"{base}/index.html#/step/{relative}")
        expect(page.locator("[data-testid=lineage]")).to_contain_text(f"at step {FORK_AT}", timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=lineage] a")).to_contain_text("train/parent-")
        expect(page.locator('[data-testid=run-view] [data-chart="loss"]')).to_contain_text("parent train/loss")
        browser_tests.screenshot(page, "publish-fork-run")
        check_page_builds_the_servers_views(page, prefix, relative)  # the parent's curve included


def test_a_forks_lineage_names_the_parent_run_and_the_step_of_its_checkpoint() -> None:
    from steps.train.train_metrics import lineage_of

    assert lineage_of("gs://b/train/hero-1a2b/checkpoints/step-12000/") == {
        "parent": "gs://b/train/hero-1a2b", "step": 12000, "checkpoint": "gs://b/train/hero-1a2b/checkpoints/step-12000"}
    assert lineage_of("/elsewhere/weights") == {"parent": None, "step": None, "checkpoint": "/elsewhere/weights"}
