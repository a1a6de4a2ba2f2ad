"""A small real DAG for the dashboard tests, run with the real executor on a local prefix.

    data/raw ──> data/clean ──> train/lsq ──> eval/lsq
        └─────────── (pseudo-dependency, dashed) ──────┘
    data/broken ──> report/broken          (FAILED, then DEP_FAILED)

`train/lsq` is a real least-squares fit by gradient descent in pure Python that logs its loss to
metrics.jsonl; it is run first with lr=0.05 and then with lr=0.1, so explain has another version
to diff against. `live/gated` (not part of that DAG) blocks on a threading.Event, so a test can
watch a page while the step runs and then let it finish.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, versioned
from executor.errors import StepFailedError
from executor.store.layout import METRICS_FILE, PROGRESS_FILE, STATS_FILE

logger = logging.getLogger(__name__)
logger.setLevel(logging.INFO)  # the step log captures INFO records even when the test run's root level is higher

GATES: dict[str, threading.Event] = {}
"""Events that `live/gated` steps wait on, by gate name (a plain, unhashed config field)."""


def _write_json(path: str, value: object) -> None:
    with fsspec.open(path, "w", auto_mkdir=True) as handle:
        json.dump(value, handle)


def _write_jsonl(path: str, rows: list[dict]) -> None:
    with fsspec.open(path, "w", auto_mkdir=True) as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)


def _read_jsonl(path: str) -> list[dict]:
    with fsspec.open(path, "r") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@dataclass(frozen=True)
class RawConfig:
    output_path: str
    docs: int = 40
    seed: int = 0


def make_raw(config: RawConfig) -> None:
    rng = random.Random(config.seed)
    rows = [
        {"id": index, "x": index / 10, "text": " ".join(rng.choice("abcde") * 3 for _ in range(5))}
        for index in range(config.docs)
    ]
    _write_jsonl(f"{config.output_path}/docs.jsonl", rows)
    _write_json(f"{config.output_path}/{STATS_FILE}", {"docs_out": len(rows), "tokens_out": 5 * len(rows)})
    _write_json(
        f"{config.output_path}/{PROGRESS_FILE}",
        {"shards_total": 4, "shards_done": 4, "rows": len(rows), "bytes": 2048, "updated": "now"},
    )
    logger.info("wrote %d raw docs", len(rows))


@dataclass(frozen=True)
class CleanConfig:
    input_path: str
    output_path: str
    drop_every: int = 4


def clean(config: CleanConfig) -> None:
    rows = _read_jsonl(f"{config.input_path}/docs.jsonl")
    kept = [row for row in rows if row["id"] % config.drop_every]
    _write_jsonl(f"{config.output_path}/docs.jsonl", kept)
    _write_json(
        f"{config.output_path}/{STATS_FILE}",
        {"docs_in": len(rows), "docs_out": len(kept), "tokens_in": 5 * len(rows), "tokens_out": 5 * len(kept)},
    )
    logger.info("kept %d of %d docs", len(kept), len(rows))


@dataclass(frozen=True)
class TrainConfig:
    input_path: str
    output_path: str
    lr: float = 0.05
    steps: int = 60


def train_least_squares(config: TrainConfig) -> None:
    """Fit y = w*x + b to y = 3x + 2 (plus fixed noise) by gradient descent, logging the loss each step."""
    rows = _read_jsonl(f"{config.input_path}/docs.jsonl")
    rng = random.Random(1)
    points = [(row["x"], 3 * row["x"] + 2 + rng.uniform(-0.1, 0.1)) for row in rows]
    weight = bias = 0.0
    metrics = []
    for step in range(config.steps):
        errors = [(weight * x + bias - y, x) for x, y in points]
        loss = sum(error * error for error, _ in errors) / len(points)
        weight -= config.lr * 2 * sum(error * x for error, x in errors) / len(points)
        bias -= config.lr * 2 * sum(error for error, _ in errors) / len(points)
        metrics.append({"step": step, "loss": loss, "weight": weight, "bias": bias, "lr": config.lr})
        if step % 20 == 0:
            logger.info("step %d loss %.4f", step, loss)
    _write_jsonl(f"{config.output_path}/{METRICS_FILE}", metrics)
    _write_json(f"{config.output_path}/model.json", {"weight": weight, "bias": bias})
    _write_json(f"{config.output_path}/{STATS_FILE}", {"docs_in": len(points), "final_loss": metrics[-1]["loss"]})


@dataclass(frozen=True)
class EvalConfig:
    model_path: str
    raw_path: str
    """A pseudo-dependency: hashed, neither waited on nor read."""
    output_path: str


def evaluate(config: EvalConfig) -> None:
    with fsspec.open(f"{config.model_path}/model.json") as handle:
        model = json.load(handle)
    rows = [
        {"task": f"x={x}", "step": index, "squared_error": (model["weight"] * x + model["bias"] - (3 * x + 2)) ** 2}
        for index, x in enumerate((0.5, 1.0, 2.0, 4.0))
    ]
    _write_jsonl(f"{config.output_path}/{METRICS_FILE}", rows)


@dataclass(frozen=True)
class BrokenConfig:
    output_path: str
    inputs: tuple[str, ...] = ()


def broken(config: BrokenConfig) -> None:
    raise ValueError("the broken step always fails (on purpose)")


@dataclass(frozen=True)
class GatedConfig:
    output_path: str
    gate: str
    label: str


def gated(config: GatedConfig) -> None:
    logger.info("waiting for gate %s", config.gate)
    _write_json(f"{config.output_path}/{PROGRESS_FILE}", {"shards_total": 2, "shards_done": 1, "rows": 5, "bytes": 10})
    if not GATES[config.gate].wait(timeout=120):
        raise TimeoutError(f"gate {config.gate} never opened")
    _write_json(f"{config.output_path}/{PROGRESS_FILE}", {"shards_total": 2, "shards_done": 2, "rows": 10, "bytes": 20})
    logger.info("gate %s opened; done", config.gate)


def dag_steps(lr: float) -> dict[str, ExecutorStep]:
    raw = ExecutorStep(name="data/raw", fn=make_raw, config=RawConfig(output_path=THIS_OUTPUT_PATH, docs=versioned(40)))
    cleaned = ExecutorStep(
        name="data/clean",
        fn=clean,
        config=CleanConfig(input_path=output_path_of(raw), output_path=THIS_OUTPUT_PATH, drop_every=versioned(4)),
    )
    train = ExecutorStep(
        name="train/lsq",
        fn=train_least_squares,
        description="least squares by gradient descent",
        config=TrainConfig(
            input_path=output_path_of(cleaned), output_path=THIS_OUTPUT_PATH, lr=versioned(lr), steps=versioned(60)
        ),
    )
    evaluation = ExecutorStep(
        name="eval/lsq",
        fn=evaluate,
        config=EvalConfig(
            model_path=output_path_of(train), raw_path=output_path_of(raw).nonblocking(), output_path=THIS_OUTPUT_PATH
        ),
    )
    bad = ExecutorStep(name="data/broken", fn=broken, config=BrokenConfig(output_path=THIS_OUTPUT_PATH))
    report = ExecutorStep(
        name="report/broken",
        fn=broken,
        config=BrokenConfig(output_path=THIS_OUTPUT_PATH, inputs=(output_path_of(bad),)),
    )
    return {"raw": raw, "clean": cleaned, "train": train, "eval": evaluation, "broken": bad, "report": report}


def build_prefix(prefix: Path) -> dict[str, ExecutorStep]:
    """Run the DAG for real: first the lr=0.05 training branch, then everything with lr=0.1."""
    first = dag_steps(lr=0.05)
    Executor(str(prefix)).run([first["train"]], caller="experiments/lsq_lr005.py")
    steps = dag_steps(lr=0.1)
    with pytest.raises(StepFailedError):
        Executor(str(prefix)).run(
            list(steps.values()), caller="experiments/lsq.py", description="the dashboard test DAG"
        )
    return steps


def gated_step(gate: str) -> ExecutorStep:
    GATES[gate] = threading.Event()
    return ExecutorStep(
        name="live/gated", fn=gated, config=GatedConfig(output_path=THIS_OUTPUT_PATH, gate=gate, label=versioned(gate))
    )


def test_the_dag_leaves_what_the_dashboard_reads(tmp_path: Path) -> None:
    build_prefix(tmp_path)
    names = sorted(path.name for path in (tmp_path / "experiments").iterdir())
    assert names[0].startswith("lsq-") and names[1].startswith("lsq_lr005-")
    trains = sorted(path.name for path in (tmp_path / "train").iterdir())
    assert len(trains) == 2
    metrics = _read_jsonl(str(tmp_path / "train" / trains[0] / METRICS_FILE))
    assert metrics[-1]["loss"] < metrics[0]["loss"]
