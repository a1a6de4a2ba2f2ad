"""The scaling step refuses a ladder whose rung lacks what the fit reads (issue 38 point 2): a missing or empty
metrics.jsonl (the curve would collapse to one point, silently) or an empty results.json; the message names the
rung and the file. A ladder that fits draws its predicted curve with its full point count, however late the
rungs' first evals."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from test_scaling import TRUE_E
from test_train_bad_input import TARGET, ladder, run_through_executor

from executor import THIS_OUTPUT_PATH
from steps.scaling.ladder import predict_from_ladder
from steps.scaling.ladder_config import LadderConfig


def damage(rung_path: str, file: str, how: str) -> Path:
    path = Path(rung_path) / file
    if how == "missing":
        path.unlink()
    else:
        path.write_text("")
    return path


@pytest.mark.parametrize("how", ["missing", "empty"])
def test_a_rung_without_metrics_fails_the_step_naming_the_rung_and_file(tmp_path, how):
    config = ladder(tmp_path)
    metrics = damage(config.rungs[1].train_path, "metrics.jsonl", how)
    status, message, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder, config)
    assert status == "FAILED"
    assert f"scaling step at {output}: rung r1 has no" in message and str(metrics) in message
    assert "loss curve is missing" in message and "rerun its train step" in message
    assert not (output / "prediction.json").exists()


def test_metrics_with_no_eval_before_the_end_are_refused_too(tmp_path):
    config = ladder(tmp_path)
    metrics = Path(config.rungs[3].train_path) / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 3, "train/loss": 4.0}) + "\n")  # a train line only
    status, message, _output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder, config)
    assert status == "FAILED"
    assert f"rung r3 has no eval/macro_loss line before the run's end in {metrics}" in message


@pytest.mark.parametrize("how", ["missing", "empty", "cut"])
def test_a_rung_with_a_missing_or_empty_results_json_names_the_rung_and_file(tmp_path, how):
    config = ladder(tmp_path)
    results = Path(config.rungs[2].evaluate_path) / "results.json"
    if how == "cut":
        results.write_text('{"macro_loss": 3.1')
    else:
        damage(config.rungs[2].evaluate_path, "results.json", how)
    status, message, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder, config)
    assert status == "FAILED" and f"scaling step at {output}: rung r2" in message and str(results) in message
    if how == "missing":
        assert "run its evaluate step first" in message
    else:
        assert "is empty or not JSON" in message and "rerun rung r2's evaluate step" in message
    assert "Traceback" not in message.splitlines()[0]


@pytest.mark.parametrize("steps_per_eval", [10, 25, 50])
def test_the_predicted_curve_always_has_its_full_point_count(tmp_path, steps_per_eval):
    from test_scaling import LADDER_COMPUTE, write_rung

    rungs = [write_rung(tmp_path, f"r{i}", c, tokens=1e6, tokens_per_step=1e4, steps_per_eval=steps_per_eval)
             for i, c in enumerate(LADDER_COMPUTE)]  # fmt: skip
    config = LadderConfig(rungs=rungs, target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=TRUE_E,
                          bootstrap_samples=20)  # fmt: skip
    status, _, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder, config)
    assert status == "SUCCESS"
    curve = json.loads((output / "prediction.json").read_text())["curve"]
    assert len(curve) == 19  # the hero's curve: 10% to 100% of the run in 5% steps
    first_eval = steps_per_eval * 1e4 / 1e6
    fractions = [point["tokens"] / TARGET.tokens for point in curve]
    assert fractions[0] == pytest.approx(max(0.1, first_eval)) and fractions[-1] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(fractions))
