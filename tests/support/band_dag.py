"""A small real DAG whose hero logs two eval metrics, for the tests of what the run view draws against the band.

    scaling/ladder ──> train/hero ──> evaluate/hero     (run with the real executor on a local prefix)
                       train/long                        a long run with one spike, one NaN and a NaN at its end
                       train/hero ──> train/fork         a fork of the hero at step 100

The scaling step writes a prediction.json the ladder view accepts, its band fitted on `eval/suite/macro_loss`.
The hero logs, on lines of their own as the train step does, `eval/suite/macro_loss` inside the band and
Levanter's `eval/macro_loss` well above it (the published site once drew the second against the band);
the evaluate step's results.json holds the suite's macro loss at the last step, as the real evaluate step does.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, versioned
from executor.store.layout import METRICS_FILE
from steps.train.train_metrics import record_lineage, seal_prediction

HERO_STEPS = 200
EVAL_EVERY = 50
BAND = (5.10, 5.31)
SUITE_FINAL = 5.2506
MACRO_FINAL = 5.488
SPIKE_STEP, NAN_STEP = 2_345, 4_567


@dataclass(frozen=True)
class LadderConfig:
    output_path: str
    steps: int = versioned(HERO_STEPS)


def ladder(config: LadderConfig) -> None:
    low, high = BAND
    curve = []
    for step in [*range(0, config.steps - 1, 10), config.steps - 1]:
        loss = 9.0 - 3.795 * step / (config.steps - 1)  # 5.205 at the last step
        curve.append({"tokens": step * 1000, "step": step, "loss": loss, "low": loss - 5.205 + low,
                      "high": loss - 5.205 + high})  # fmt: skip
    prediction = {
        "fit": {"A": 40.0, "alpha": 0.1, "asymptote": 2.0, "rms_log_residual": 0.01},
        "prediction": {"compute": 1e18, "loss": 5.205, "low": low, "high": high},
        "rungs": [
            {
                "name": f"d{width}",
                "compute": compute,
                "final_loss": 2.0 + 40.0 * compute**-0.1,
                "tokens": 50_000,  # as the scaling step records it: the run's tokens, beside its FLOPs
                "curve": [
                    {"tokens": tokens, "loss": 9.0 - (7.0 - 40.0 * compute**-0.1) * tokens / 50_000}
                    for tokens in range(5_000, 50_001, 5_000)
                ],
            }
            for width, compute in ((64, 1e14), (128, 1e15), (256, 1e16))
        ],
        "curve": curve,
        "target": {"name": "train/hero", "compute": 1e18, "tokens": config.steps * 1000, "tokens_per_step": 1000},
        "metric": "eval/suite/macro_loss",
    }
    Path(config.output_path, "prediction.json").write_text(json.dumps(prediction))


@dataclass(frozen=True)
class HeroConfig:
    output_path: str
    prediction_path: str
    steps: int = versioned(HERO_STEPS)


def hero(config: HeroConfig) -> None:
    """Seals its prediction as the train step does when it starts, then logs its lines, a second apart."""
    seal_prediction(config.output_path, config.prediction_path)
    start = time.time() + 1.0
    lines = []
    for step in range(config.steps):
        lines.append({"step": step, "time": start + step, "train/loss": 9.0 - 3.9 * step / config.steps,
                      "optim/learning_rate": 3e-4})  # fmt: skip
        if step % EVAL_EVERY == EVAL_EVERY - 1:
            share = (step + 1) / config.steps
            lines.append({"step": step, "eval/suite/macro_loss": 9.0 - (9.0 - SUITE_FINAL) * share,
                          "eval/macro_loss": 9.0 - (9.0 - MACRO_FINAL) * share})  # fmt: skip
    Path(config.output_path, METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))


@dataclass(frozen=True)
class EvaluateConfig:
    output_path: str
    run_path: str


def evaluate(config: EvaluateConfig) -> None:
    rows = [json.loads(line) for line in Path(config.run_path, METRICS_FILE).read_text().splitlines()]
    final = [row["eval/suite/macro_loss"] for row in rows if "eval/suite/macro_loss" in row][-1]
    Path(config.output_path, "results.json").write_text(json.dumps({"macro_loss": final, "metric": "eval_suite"}))


@dataclass(frozen=True)
class ForkConfig:
    output_path: str
    initialize_from: str


def fork(config: ForkConfig) -> None:
    """A fork of the hero at step 100, as the train step records one (steps/train/train_metrics.py)."""
    record_lineage(config.output_path, config.initialize_from)
    lines = [{"step": step, "train/loss": 5.5 - step / 1000, "optim/learning_rate": 1e-4} for step in range(101, 160)]
    Path(config.output_path, METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))


@dataclass(frozen=True)
class LongRunConfig:
    output_path: str
    steps: int = versioned(6_000)


def long_loss(step: int) -> float:
    """A falling loss with a wobble; the spike and the NaNs are put in by `long_run`."""
    return 3.0 + 5.0 * (step + 100) ** -0.3 + 0.01 * math.sin(step * 0.37)


def long_run(config: LongRunConfig) -> None:
    """One line a step: the spike at SPIKE_STEP (30x), a NaN at NAN_STEP and at the last step."""
    with Path(config.output_path, METRICS_FILE).open("w") as handle:
        for step in range(config.steps):
            loss = long_loss(step) * (30 if step == SPIKE_STEP else 1)
            if step in (NAN_STEP, config.steps - 1):
                loss = math.nan
            handle.write(json.dumps({"step": step, "train/loss": loss}) + "\n")


def build_band_prefix(prefix: Path, long_steps: int = 6_000) -> dict[str, str]:
    """Run the DAG; returns each step's output path relative to the prefix, by step name."""
    scaling = ExecutorStep(name="scaling/ladder", fn=ladder, config=LadderConfig(THIS_OUTPUT_PATH))
    train = ExecutorStep(name="train/hero", fn=hero, config=HeroConfig(THIS_OUTPUT_PATH, output_path_of(scaling)))
    evaluation = ExecutorStep(
        name="evaluate/hero", fn=evaluate, config=EvaluateConfig(THIS_OUTPUT_PATH, output_path_of(train))
    )
    forked = ExecutorStep(
        name="train/fork", fn=fork, config=ForkConfig(THIS_OUTPUT_PATH, output_path_of(train, "checkpoints/step-100"))
    )
    long = ExecutorStep(name="train/long", fn=long_run, config=LongRunConfig(THIS_OUTPUT_PATH, versioned(long_steps)))
    steps = [scaling, train, evaluation, forked, long]
    executor = Executor(str(prefix))
    executor.run(steps, caller="experiments/band_demo.py", description="the band and extremes test DAG")
    return {step.name: executor.output_paths[step][len(str(prefix)) + 1 :] for step in steps}
