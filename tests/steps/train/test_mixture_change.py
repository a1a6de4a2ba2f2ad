"""A mid-run mixture change on real Levanter training, resumed across it (the hero changed its mixture at step
108,000 of 390,251; here at step 7 of 12, in the middle of a mixture block).

Run A trains straight through phases [(0, both), (7, docstrings only)]. Run B is the same step killed after
its checkpoint at step 4 (its output folder holds only that checkpoint) and rerun: it resumes before the
change and trains past it. Their losses agree step for step, so the data loader's offsets survived the resume
and the change. metrics.jsonl carries `data/tokens/<component>` with each loss: from the change on, the
component the late phase leaves out stops growing, and the composition view sums what each phase ate (and,
without training, takes a resumed run's later lines and stops at the last step logged).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import browser_fixtures as browser_tests
import pytest
from browser_fixtures import expect
from test_train import SOURCES, build_data, train_config, train_losses

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep
from executor.watch.app import DashboardApp
from steps.train.data_order import TOKENS_PREFIX
from steps.train.train import train
from steps.train.train_metrics import read_metrics

STEPS, CHANGE, CHECKPOINT, BATCH, SEQ_LEN = 12, 7, 4, 8, 64
STDLIB, DOCSTRINGS = SOURCES
PHASES = [(0, {STDLIB: 0.5, DOCSTRINGS: 0.5}), (CHANGE, {DOCSTRINGS: 1.0})]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    data = build_data(tmp_path_factory.mktemp("change-data"))
    prefix = tmp_path_factory.mktemp("change-prefix")
    straight, resumed = prefix / "train" / "straight", prefix / "train" / "resumed"
    settings = dict(num_train_steps=STEPS, weights=PHASES, train_batch_size=BATCH, steps_per_eval=STEPS,
                    checkpoint_every_steps=CHECKPOINT, temporary_checkpoint_seconds=3600.0,
                    hf_export=False)  # fmt: skip
    train(train_config(data, str(straight), **settings))
    # B as a run killed after step 4 leaves it: its checkpoint and nothing else.
    shutil.copytree(straight / "checkpoints" / f"step-{CHECKPOINT}", resumed / "checkpoints" / f"step-{CHECKPOINT}")
    train(train_config(data, str(resumed), **settings))
    return {"straight": read_metrics(str(straight)), "resumed": read_metrics(str(resumed)), "prefix": str(prefix)}


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.timeout(1500)
def test_a_run_resumed_before_a_mid_block_change_trains_as_one_that_never_stopped(runs) -> None:
    straight = dict(train_losses(runs["straight"]))
    resumed = train_losses(runs["resumed"])
    assert resumed[0][0] == CHECKPOINT + 1 and resumed[-1][0] == STEPS - 1  # it resumed, then crossed the change
    for step, loss in resumed:
        assert loss == pytest.approx(straight[step], abs=1e-5), step


def tokens_by_step(records: list[dict]) -> dict[int, dict[str, int]]:
    """Per step with a loss, the `data/tokens/<component>` figures logged beside it."""
    return {
        record["step"]: {key.removeprefix(TOKENS_PREFIX): value for key, value in record.items()
                         if key.startswith(TOKENS_PREFIX)}
        for record in records if "train/loss" in record
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.timeout(1500)
def test_tokens_seen_per_component_follow_the_sampling_across_the_change(runs) -> None:
    straight, resumed = tokens_by_step(runs["straight"]), tokens_by_step(runs["resumed"])
    for step, tokens in straight.items():
        assert set(tokens) == set(SOURCES) and sum(tokens.values()) == (step + 1) * BATCH * SEQ_LEN
    assert 0 < straight[CHANGE - 1][STDLIB] < CHANGE * BATCH * SEQ_LEN  # both were eaten before the change
    assert straight[STEPS - 1][STDLIB] == straight[CHANGE - 1][STDLIB]  # the late phase leaves stdlib out
    assert {step: resumed[step] for step in resumed} == {step: straight[step] for step in resumed}


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.timeout(1500)
def test_the_composition_view_shows_what_each_phase_ate(runs) -> None:
    response = DashboardApp(runs["prefix"]).handle("/api/step/composition", {"path": "train/straight"})
    eaten = json.loads(response.body)["eaten"]
    assert [phase["start_step"] for phase in eaten["phases"]] == [0, CHANGE]
    first, second = (phase["tokens"] for phase in eaten["phases"])
    assert first[STDLIB] > 0 and first[DOCSTRINGS] > 0 and second[STDLIB] == 0
    assert sum(first.values()) == CHANGE * BATCH * SEQ_LEN
    assert sum(second.values()) == (STEPS - CHANGE) * BATCH * SEQ_LEN
    assert Path(runs["prefix"], "train", "straight", "mixture.json").exists()


@dataclass(frozen=True)
class RunFilesConfig:
    """A run's mixture.json and metrics.jsonl, written as a train step writes them (a resumed run's lines too)."""

    output_path: str


def write_run_files(config: RunFilesConfig) -> None:
    run = Path(config.output_path)
    run.mkdir(parents=True, exist_ok=True)
    (run / "mixture.json").write_text(json.dumps({"schedule": [[0, {"a": 1.0}], [3, {"b": 1.0}], [9, {"a": 1.0}]]}))
    lines = [{"step": step, "train/loss": 5.0, f"{TOKENS_PREFIX}a": 10 * min(step + 1, 3),
              f"{TOKENS_PREFIX}b": 10 * max(0, step - 2)} for step in range(6)]  # fmt: skip
    lines.insert(3, {"step": 4, "train/loss": 9.0, f"{TOKENS_PREFIX}a": 999, f"{TOKENS_PREFIX}b": 999})  # killed run
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.fixture
def written_run(tmp_path: Path) -> str:
    """The run's path relative to the prefix `tmp_path`, written by a real executor step."""
    executor = Executor(str(tmp_path))
    step = ExecutorStep(name="train/run", fn=write_run_files, config=RunFilesConfig(output_path=THIS_OUTPUT_PATH))
    executor.run([step])
    return executor.output_paths[step][len(str(tmp_path)) + 1 :]


def test_the_eaten_table_takes_a_resumed_runs_later_lines_and_stops_at_the_last_step(tmp_path, written_run) -> None:
    app = DashboardApp(str(tmp_path))
    assert "composition" in json.loads(app.handle("/api/step/views", {"path": written_run}).body)["views"]
    eaten = json.loads(app.handle("/api/step/composition", {"path": written_run}).body)["eaten"]
    assert eaten["step"] == 5 and eaten["components"] == ["a", "b"]
    assert [(p["start_step"], p["end_step"], p["tokens"]) for p in eaten["phases"]] == [
        (0, 2, {"a": 30, "b": 0}), (3, 5, {"a": 0, "b": 30})]  # the third phase is not reached yet




@pytest.mark.browser
def test_the_step_page_has_the_eaten_table(page, tmp_path, written_run) -> None:  # type: ignore[no-untyped-def]
    with browser_tests.served(tmp_path) as base:
        page.goto(f"{base}/step/{written_run}")
        table = page.locator('[data-view="composition"] [data-testid=eaten-table]')
        expect(table).to_contain_text("phase 2: steps 3-5", timeout=browser_tests.DEADLINE_MS)
        expect(table.locator('tr[data-component="b"] td[data-value="30"]')).to_have_count(1)
        expect(table.locator('tr[data-component="a"] td[data-value="30"]')).to_contain_text("100.0%")
        browser_tests.screenshot(page, "composition-eaten-per-phase")
