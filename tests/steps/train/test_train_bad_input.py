"""The training half under bad input and faults (issue 25): each case runs its step through the Executor on
damaged copies of real outputs and checks the status written (FAILED, never SUCCESS on bad data) and that the
message names the step and the file or component, and says what to do."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
from paths import REPO
from test_scaling import HERO_COMPUTE, LADDER_COMPUTE, TRUE_E, law, write_rung
from test_train import SOURCES, build_data, train_config

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep
from executor.errors import StepFailedError
from executor.store.events import read_events
from executor.store.layout import METRICS_FILE
from executor.store.metrics_log import metric_number, rows_by_step
from executor.watch.files import metrics_records
from executor.watch.site.publish import SitePublisher
from executor.watch.training.alerts import read_alerts
from steps.evaluate.evaluate import EvaluateConfig, evaluate
from steps.scaling.ladder import predict_from_ladder
from steps.scaling.ladder_config import LadderConfig, LadderTarget
from steps.train.train import TrainConfig, data_mixture, record_mixture, train
from steps.train.train_metrics import read_metrics


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


def test_three_rungs_with_a_fixed_asymptote_and_no_fall_fail_too(tmp_path):
    config = ladder(tmp_path, [3.000, 3.004, 3.010], asymptote=1.0)
    config = LadderConfig(rungs=config.rungs[:3], target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=1.0)
    status, message, output = run_through_executor(tmp_path / "prefix", "scaling/ladder", predict_from_ladder, config)
    assert status == "FAILED" and f"scaling step at {output}" in message and "not positive" in message


def test_a_zero_width_band_and_an_asymptote_at_its_bound_are_flagged(tmp_path, caplog):
    # Three rungs exactly on the law with E fixed: no residual, so the band has no width.
    config = ladder(tmp_path)
    config = LadderConfig(rungs=config.rungs[:3], target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=TRUE_E)
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
    from executor.watch.training.ladder_view import ladder_view

    config = ladder(tmp_path)
    config = LadderConfig(rungs=config.rungs[:3], target=TARGET, output_path=THIS_OUTPUT_PATH, asymptote=TRUE_E)
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


# --- the train step's data inputs (points 4 to 7) ------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tokenizer and two tokenize step outputs of real text (test_train's)."""
    return build_data(tmp_path_factory.mktemp("train-data"))


def train_through_executor(prefix: Path, config: TrainConfig) -> tuple[str, str, Path]:
    return run_through_executor(prefix, "train/tiny", train, dataclasses.replace(config, output_path=THIS_OUTPUT_PATH))


def write_weights(folder: Path, weights: dict[str, float]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.json").write_text(json.dumps({"phases": [{"fraction": 1.0, "weights": weights}]}))
    return folder / "weights.json"


def test_a_weight_on_a_misspelt_component_fails_the_train_step(data, tmp_path):
    weights_file = write_weights(tmp_path / "weights", {"python_stdl1b": 0.9, "python_docstrings": 0.1})
    config = train_config(data, "unused", mixture_weights_path=str(weights_file.parent))
    status, message, output = train_through_executor(tmp_path / "prefix", config)
    assert status == "FAILED"
    assert f"train step {output.name} ({output})" in message and f"phase 1 of {weights_file}" in message
    assert "['python_stdl1b'] name no component of this run" in message and "fix " in message
    assert not (output / "checkpoints").exists()


def test_weights_on_cells_tokenize_left_out_are_dropped_by_name_in_the_log_and_mixture_json(data, tmp_path, caplog):
    tokenized = tmp_path / "tokenized"
    tokenized.mkdir()
    (tokenized / "components.json").write_text(json.dumps({"components": {}, "excluded": {"cell_b": {}}}))
    weights_file = write_weights(tmp_path / "weights", {"cell_b": 0.2, "python_stdlib": 0.4, "python_docstrings": 0.4})
    output = tmp_path / "train-out"
    weights_path = str(weights_file.parent)
    config = train_config(data, str(output), components_path=str(tokenized), mixture_weights_path=weights_path)
    assert data_mixture(config)[1] == [(0, {"python_stdlib": 0.4, "python_docstrings": 0.4})]
    record_mixture(config)
    assert json.loads((output / "mixture.json").read_text())["dropped"] == {"cell_b": [0.2]}
    assert any("cell_b" in record.getMessage() and str(output) in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ({"python_stdlib": math.nan, "python_docstrings": 0.5}, "the weight of 'python_stdlib' is nan, not a finite"),
        ({"python_stdlib": math.inf, "python_docstrings": 0.5}, "the weight of 'python_stdlib' is inf, not a finite"),
        ({"python_stdlib": math.nan, "python_docstrings": math.nan}, "is nan, not a finite number"),
        ({"python_stdlib": -0.5, "python_docstrings": 1.0}, "the weight of 'python_stdlib' is negative (-0.5)"),
    ],
    ids=["nan", "inf", "all-nan", "negative"],
)
def test_a_non_finite_or_negative_weight_names_the_step_file_phase_and_component(data, tmp_path, weights, expected):
    weights_file = write_weights(tmp_path / "weights", weights)
    config = train_config(data, "unused", mixture_weights_path=str(weights_file.parent))
    status, message, output = train_through_executor(tmp_path / "prefix", config)
    assert status == "FAILED"
    assert f"train step {output.name} ({output}): phase 1 of {weights_file}" in message and expected in message
    assert "rerun its mixture_weights step" in message


def damaged_copy(data: dict[str, str], root: Path, damage: Any) -> dict[str, str]:
    """The data with a copy of python_docstrings whose train split `damage(split folder)` has damaged."""
    copy = root / "python_docstrings"
    shutil.copytree(data["python_docstrings"], copy)
    damage(copy / "train")
    return {**data, "python_docstrings": str(copy)}


def cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda split: cut_in_half(split / "shard_ledger.json"), "shard_ledger.json is not valid JSON"),
        (lambda split: (split / "shard_ledger.json").write_text("[1, 2]"), "holds a JSON list, not a Levanter cache"),
        (lambda split: cut_in_half(split / "part-00000" / "input_ids" / "data" / "c" / "0"), "cannot be read"),
        (lambda split: cut_in_half(split / "part-00000" / "input_ids" / "offsets" / "c" / "0"), "cannot be read"),
        (lambda split: (split / "part-00000" / "input_ids" / "offsets" / "c" / "0").unlink(), "holds 0 rows"),
    ],
    ids=["ledger-cut", "ledger-a-list", "data-file-cut", "offsets-file-cut", "offsets-file-gone"],
)
def test_a_damaged_cache_fails_the_train_step_naming_the_component_and_file(data, tmp_path, damage, expected):
    damaged = damaged_copy(data, tmp_path / "damaged", damage)
    split = Path(damaged["python_docstrings"]) / "train"
    status, message, output = train_through_executor(tmp_path / "prefix", train_config(damaged, "unused"))
    assert status == "FAILED"
    assert f"train step {output.name} ({output}): component 'python_docstrings': {split}" in message
    assert expected in message and "rerun the tokenize step" in message
    assert not (output / "checkpoints").exists()


# --- storage errors in the executor's failure path (point 10) -----------------------------------------------

FULL_DISK_RUNNER = textwrap.dedent("""
    import logging, resource, signal, sys
    from dataclasses import dataclass
    # Every file this process writes is capped at LIMIT bytes: a write past it fails with EFBIG, as writes on
    # a full disk fail with ENOSPC (no file name in the error). SIGXFSZ would kill the process instead.
    LIMIT = 128 * 1024
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))
    logging.basicConfig(level=logging.INFO)
    from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, storage

    @dataclass(frozen=True)
    class ExportConfig:
        output_path: str

    def export(config: ExportConfig) -> None:
        # An HF export's shape: a long log, then a weights file larger than the disk has room for.
        for number in range(2000):
            logging.getLogger("export").info("converted tensor %d of 2000: %s", number, "x" * 80)
        storage.write_atomic(storage.join(config.output_path, "hf", "model.safetensors"), bytes(4 * LIMIT))

    step = ExecutorStep(name="train/export", fn=export, config=ExportConfig(output_path=THIS_OUTPUT_PATH))
    executor = Executor(sys.argv[1])
    executor.run([step])
""")


def test_a_full_disk_during_an_export_ends_failed_with_its_log_and_the_file_named(tmp_path):
    prefix = tmp_path / "prefix"
    run = subprocess.run([sys.executable, "-c", FULL_DISK_RUNNER, str(prefix)], capture_output=True, text=True,
                         cwd=REPO, timeout=600)  # fmt: skip
    output = next(prefix.glob("train/export-*"))
    events = read_events(str(output))
    assert run.returncode != 0 and str(events[-1].status) == "FAILED", (events[-1], run.stderr[-3000:])
    assert events[-1].message.startswith("OSError: [Errno 27] File too large")
    assert f"File too large: '{output}/hf/model.safetensors'" in events[-1].message
    # The whole log did not fit: the store holds its end and the traceback, the message says where the rest is.
    kept = events[-1].message.split("it is kept at ")[-1]
    assert "converted tensor 0 of 2000" in Path(kept).read_text()
    log = (output / "logs" / "step.log").read_text()
    assert f"it is kept at {kept}" in log and "converted tensor" in log
    model_file = output / "hf" / "model.safetensors"
    assert log.rstrip().endswith(f"OSError: [Errno 27] File too large: {str(model_file)!r}")
    Path(kept).unlink()
    assert not list(output.rglob("*.tmp-*")), "a failed write leaves no partial temp file"


# --- a trained run's checkpoints, damaged (points 1, 2 and 8) --------------------------------------------------


def tiny_run(data: dict[str, str], **changes: Any) -> TrainConfig:
    """Three steps of the tiny MoE with a permanent checkpoint after each."""
    fields = dict(num_train_steps=3, checkpoint_every_steps=1, temporary_checkpoint_seconds=1e6, steps_per_eval=100,
                  max_eval_batches=1, watch_interval=100, hf_export=False)  # fmt: skip
    return train_config(data, "unused", **{**fields, **changes})


@pytest.fixture(scope="module")
def trained(data: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The train step's output of one tiny run, trained through the Executor (copy it before damaging it)."""
    status, message, output = train_through_executor(tmp_path_factory.mktemp("trained"), tiny_run(data))
    assert status == "SUCCESS", message
    return output


def checkpoint_copy(trained: Path, root: Path) -> tuple[Path, Path]:
    """A copy of the run's checkpoints/ and its latest step-N folder."""
    copy = root / "checkpoints"
    shutil.copytree(trained / "checkpoints", copy)
    return copy, max(copy.glob("step-*"), key=lambda folder: int(folder.name.removeprefix("step-")))


def evaluate_through_executor(data: dict[str, str], prefix: Path, checkpoint_path: Path) -> tuple[str, str, Path]:
    config = EvaluateConfig(checkpoint_path=str(checkpoint_path), shape=tiny_run(data).shape,
                            tokenizer_path=data["tokenizer"], components={source: data[source] for source in SOURCES},
                            output_path=THIS_OUTPUT_PATH, max_batches=1)  # fmt: skip
    return run_through_executor(prefix, "evaluate/tiny", evaluate, config)


def test_a_checkpoint_with_non_finite_weights_fails_the_evaluate_step(data, trained, tmp_path):
    checkpoints, latest = checkpoint_copy(trained, tmp_path)
    # The final norm's weights go NaN, as a diverging run's do: written into the checkpoint's own OCDBT store.
    spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{latest}/",
                                           "path": "model/transformer/norm/weight/"}}  # fmt: skip
    norm = ts.open(spec).result()
    norm.write(np.full(norm.shape, np.nan, dtype=np.float32)).result()
    status, message, output = evaluate_through_executor(data, tmp_path / "prefix", checkpoints)
    assert status == "FAILED"
    assert f"evaluate step {output.name} ({output}): the checkpoint {latest} scores" in message
    assert "macro_loss = nan" in message and "python_stdlib loss = nan" in message
    assert "Evaluate an earlier checkpoint" in message and not (output / "results.json").exists()


def test_a_damaged_latest_checkpoint_is_refused_not_silently_skipped(data, trained, tmp_path):
    checkpoints, latest = checkpoint_copy(trained, tmp_path)
    cut_in_half(latest / "metadata.json")
    status, message, output = evaluate_through_executor(data, tmp_path / "prefix", checkpoints)
    assert status == "FAILED" and not (output / "results.json").exists()
    label = f"evaluate step {output.name} ({output})"
    assert f"{label}: the checkpoint {latest} is damaged ({latest}/metadata.json" in message
    assert f"Move {latest} aside to use the previous complete checkpoint" in message
    # The train step, resuming from the same damage, says the same instead of a bare JSONDecodeError.
    executor, step, run_output = fork(trained, tmp_path / "run", tiny_run(data))
    cut_in_half(run_output / "checkpoints" / latest.name / "metadata.json")
    with pytest.raises(StepFailedError):
        executor.run([step])
    last = read_events(str(run_output))[-1]
    assert str(last.status) == "FAILED"
    assert f"train step {run_output.name} ({run_output}): the checkpoint {run_output}/checkpoints/{latest.name} is " \
           "damaged" in (last.message or "")  # fmt: skip


def fork(trained: Path, prefix: Path, config: TrainConfig) -> tuple[Executor, ExecutorStep, Path]:
    """A train step under `prefix` that starts from a copy of the trained run's checkpoints and metrics."""
    step = ExecutorStep(name="train/tiny", fn=train, config=dataclasses.replace(config, output_path=THIS_OUTPUT_PATH))
    executor = Executor(str(prefix))
    executor.run([step], dry_run=True)
    output = Path(executor.output_paths[step])
    shutil.copytree(trained / "checkpoints", output / "checkpoints")
    shutil.copy(trained / "metrics.jsonl", output / "metrics.jsonl")
    return executor, step, output


@pytest.fixture(scope="module")
def diverged(data: dict[str, str], trained: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fork of the trained run, continued where it cannot stay finite, evaluated and watched every step; its
    prefix and output. A z-loss weight of 1e30 makes the gradient's entries ~1e27, whose squares overflow float32:
    the gradient norm the watch logs is +inf while the loss (~4e31) is still finite. The clip to norm 1 then scales
    that gradient to zero, but weight decay at a learning rate of 1e30 throws the weights out of range, so the eval
    after that step is NaN, and so is the next step's loss: Levanter stops the run (`crash_on_nan`)."""
    config = tiny_run(data, num_train_steps=6, learning_rate=1e30, z_loss_weight=1e30, watch_interval=1,
                      steps_per_eval=1)  # fmt: skip
    prefix = tmp_path_factory.mktemp("diverged") / "prefix"
    executor, step, output = fork(trained, prefix, config)
    with pytest.raises(StepFailedError):
        executor.run([step])
    return prefix, output


def test_a_diverged_run_names_the_last_finite_step_and_checkpoint_and_what_to_try(diverged):
    _, output = diverged
    last = read_events(str(output))[-1]
    message = last.message or ""
    finite = [r["step"] for r in read_metrics(str(output)) if math.isfinite(r.get("train/loss", math.nan))]
    assert str(last.status) == "FAILED"
    assert f"train step {output.name} ({output}): the training loss diverged" in message
    assert f"the last finite train/loss in {output}/metrics.jsonl is at step {max(finite)}" in message
    assert f"the last complete checkpoint is {output}/checkpoints/step-" in message
    assert "Try a lower learning_rate (now 1e+30)" in message


def refuse_bare_constants(token: str) -> None:
    raise AssertionError(f"a bare {token} in metrics.jsonl: not JSON, a browser's parser refuses the line")


def test_a_diverged_runs_nonfinite_figures_are_recorded_as_the_trainer_wrote_them_and_alerted(diverged, tmp_path):
    """The trainer's own writer, not a hand-written line: the infinite gradient norm and the NaN eval loss of the
    step before the run stopped are in metrics.jsonl as "Infinity" and "NaN" (strict JSON, never null), the watch
    reads them back as what they were, and the publisher fires nonfinite_grad and nonfinite_eval on the FAILED step."""
    prefix, output = diverged
    assert str(read_events(str(output))[-1].status) == "FAILED"
    text = (output / METRICS_FILE).read_text()
    assert '"grad/norm/total": "Infinity"' in text and '"eval/macro_loss": "NaN"' in text
    for line in text.splitlines():
        json.loads(line, parse_constant=refuse_bare_constants)
    rows = rows_by_step(metrics_records(str(output / METRICS_FILE)) or [])
    last = max(step for step, row in rows.items() if "train/loss" in row)  # the NaN loss after it is never logged
    assert math.isfinite(rows[last]["train/loss"]) and rows[last]["train/loss"] > 1e30
    assert metric_number(rows[last]["grad/norm/total"]) == math.inf
    assert math.isnan(metric_number(rows[last]["eval/macro_loss"]))  # type: ignore[arg-type]
    assert all(math.isfinite(metric_number(rows[step]["train/loss"])) for step in range(last))  # type: ignore[arg-type]

    SitePublisher(str(prefix), str(tmp_path / "site")).cycle()
    fired = {(alert["rule"], alert["step"]) for alert in read_alerts(str(output))}
    assert {("nonfinite_grad", last), ("nonfinite_eval", last)} <= fired
    relative = output.relative_to(prefix).as_posix()
    view = json.loads((tmp_path / "site" / "data" / "step" / relative / "run.json").read_text())
    named = {entry["key"]: (entry["first"], entry["value"]) for entry in view["nonfinite"]}
    assert named["grad/norm/total"] == (last, "inf") and named["eval/macro_loss"] == (last, "nan")


# A restore that fails on a cut file leaves one of tensorstore's read futures behind; its done-callback targets
# the asyncio loop Levanter has closed by then and raises "Event loop is closed" whenever the garbage collector
# gets to it, which pytest reports as an unraisable exception in whichever test is running (the library's
# failure path, not this step's: the step's own outcome is what the assertions check).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_latest_checkpoint_with_a_cut_tensor_file_is_moved_aside_and_the_rerun_resumes_before_it(
    data, trained, tmp_path
):
    executor, step, output = fork(trained, tmp_path / "prefix", tiny_run(data))
    steps = sorted(int(folder.name.removeprefix("step-")) for folder in (output / "checkpoints").glob("step-*"))
    latest = output / "checkpoints" / f"step-{steps[-1]}"
    # Every data file of the checkpoint is cut: which file holds which tensor depends on how the asynchronous
    # save grouped its writes, so cutting only one (the largest) could leave every tensor readable.
    for data_file in (latest / "d").iterdir():
        cut_in_half(data_file)
    with pytest.raises(StepFailedError):
        executor.run([step])
    last = read_events(str(output))[-1]
    message = last.message or ""
    assert str(last.status) == "FAILED"
    assert f"train step {output.name} ({output}): the checkpoint {latest} cannot be read" in message
    aside = next((output / "damaged-checkpoints").glob(f"{latest.name}-*"))
    assert f"moved aside to {aside}" in message and not latest.exists()
    previous = f"resumes from {output}/checkpoints/step-{steps[-2]}" if len(steps) > 1 else "starts from step 0"
    assert previous in message
    # The rerun (what the executor does after a failure) resumes from the previous checkpoint and finishes.
    Executor(str(tmp_path / "prefix")).run([step])
    assert str(read_events(str(output))[-1].status) == "SUCCESS" and latest.exists()
    gc.collect()  # the leaked future's callback fails here, under this test's filter, not in a later test
