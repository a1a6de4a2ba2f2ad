"""The training half under bad input and faults (issue 25): each case runs its step through the Executor on
damaged copies of real outputs and checks the status written (FAILED, never SUCCESS on bad data) and that the
message names the step and the file or component, and says what to do."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_scaling import HERO_COMPUTE, LADDER_COMPUTE, TRUE_E, law, write_rung

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep
from executor.errors import StepFailedError
from executor.status import read_events
from steps.scaling.ladder import LadderConfig, LadderTarget, predict_from_ladder


def run_through_executor(prefix: Path, name: str, fn: Any, config: Any) -> tuple[str, str, Path]:
    """Run one step; return its last status, that event's message and its output path."""
    step = ExecutorStep(name=name, fn=fn, config=config)
    executor = Executor(str(prefix))
    try:
        executor.run([step])
    except StepFailedError:
        pass  # the status written is what the tests check
    output_path = Path(executor.output_paths[step])
    last = read_events(str(output_path))[-1]
    return str(last.status), last.message or "", output_path


# --- the scaling step (points 3 and 11) ---------------------------------------------------------------------

TARGET = LadderTarget(name="hero", flops=HERO_COMPUTE, tokens=5e8, tokens_per_step=2e4)


def ladder(root: Path, losses: list[float] | None = None, asymptote: float | None = TRUE_E) -> LadderConfig:
    """Four rungs as the train and evaluate steps write them; `losses` replaces their final losses."""
    rungs = [write_rung(root, f"r{i}", c, tokens=1e6, tokens_per_step=1e4, steps_per_eval=10)
             for i, c in enumerate(LADDER_COMPUTE)]  # fmt: skip
    for rung, loss in zip(rungs, losses or [], strict=False):
        (Path(rung.evaluate_path) / "results.json").write_text(json.dumps({"macro_loss": loss}))
    return LadderConfig(rungs=rungs, target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=asymptote,
                        bootstrap_samples=50)  # fmt: skip


def test_losses_that_rise_with_compute_fail_the_scaling_step(tmp_path):
    rising = [2.90, 2.95, 3.00, 3.02]
    status, message, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder,
                                                   ladder(tmp_path, rising, asymptote=None))  # fmt: skip
    assert status == "FAILED"
    assert f"scaling step at {output}" in message and "alpha = " in message and "not positive" in message
    assert "do not fall with compute" in message and "2.9 at 5.5e+19" in message
    assert not (output / "prediction.json").exists()


def test_two_rungs_with_a_fixed_asymptote_and_no_fall_fail_too(tmp_path):
    config = ladder(tmp_path, [3.000, 3.004], asymptote=1.0)
    config = LadderConfig(rungs=config.rungs[:2], target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=1.0)
    status, message, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder, config)
    assert status == "FAILED" and f"scaling step at {output}" in message and "not positive" in message


def test_a_zero_width_band_and_an_asymptote_at_its_bound_are_flagged(tmp_path, caplog):
    # Two rungs on an exact law with E fixed: every resample refits the same line, so the band has no width.
    config = ladder(tmp_path)
    config = LadderConfig(rungs=config.rungs[:2], target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=TRUE_E)
    status, _, output = run_through_executor(tmp_path / "prefix", "scaling/two", predict_from_ladder, config)
    document = json.loads((output / "prediction.json").read_text())
    assert status == "SUCCESS"
    assert any("has zero width" in warning for warning in document["warnings"])
    assert any("has zero width" in record.getMessage() and str(output) in record.getMessage()
               for record in caplog.records)  # fmt: skip
    # Losses on a pure power law with no floor: the free asymptote is pushed to its bound at 0.
    no_floor = [float(500 * c**-0.155) for c in LADDER_COMPUTE]
    (tmp_path / "free").mkdir()
    free = ladder(tmp_path / "free", no_floor, asymptote=None)
    status, _, output = run_through_executor(tmp_path / "prefix", "scaling/free", predict_from_ladder, free)
    document = json.loads((output / "prediction.json").read_text())
    assert status == "SUCCESS"
    assert any("sits at its lower bound" in warning for warning in document["warnings"])


def test_the_ladder_view_shows_the_scaling_steps_warnings(tmp_path):
    from executor.dashboard.ladder_view import ladder_view

    config = ladder(tmp_path)
    config = LadderConfig(rungs=config.rungs[:2], target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=TRUE_E)
    _, _, output = run_through_executor(tmp_path / "prefix", "scaling/two", predict_from_ladder, config)
    view = ladder_view(str(tmp_path / "prefix"), str(output), output.name, None)
    assert any("has zero width" in warning for warning in view["warnings"])


@pytest.mark.parametrize("where", ["curve", "final"])
def test_a_non_finite_rung_loss_names_the_rung_the_file_and_the_step(tmp_path, where):
    config = ladder(tmp_path)
    rung = config.rungs[2]
    if where == "curve":
        metrics = Path(rung.train_path) / "metrics.jsonl"
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        lines[3]["eval/macro_loss"] = math.nan
        metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
        expected = f"rung r2 has a non-finite eval loss (nan) at step {lines[3]['step']} in {metrics}"
    else:
        results = Path(rung.evaluate_path) / "results.json"
        results.write_text(json.dumps({"macro_loss": math.inf}))
        expected = f"rung r2 has a non-finite eval loss (inf) at the end in {results}"
    status, message, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder, config)
    assert status == "FAILED"
    assert f"scaling step at {output}" in message and expected in message and "retrain or re-evaluate" in message


def test_fit_warnings_are_empty_for_a_well_posed_ladder(tmp_path):
    rng = np.random.default_rng(7)
    noisy = [float(law(c) * (1 + rng.normal(0, 0.003))) for c in LADDER_COMPUTE]
    status, _, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder,
                                             ladder(tmp_path, noisy, asymptote=TRUE_E))  # fmt: skip
    assert status == "SUCCESS" and json.loads((output / "prediction.json").read_text())["warnings"] == []
