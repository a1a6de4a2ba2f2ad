"""The DAG the dashboard views' tests read (test_training_views.py, tests/executor/watch/training), run by the real
executor:

    corpus (2 sources) ─> tokenizer ─> tokenize x2 ─────────────────────────────┐
         └─> quality classifier ─> cells ─> mixture_weights (2 phases)          │
    rung d1..d4 (figures) ─> scaling (predict_from_ladder) ─> train (tiny MoE, 8 steps) ─> evaluate

The rungs are the only stand-ins: one small step each writes the figures a trained and evaluated rung leaves
(`metrics.jsonl` eval losses during training, `results.json`'s macro loss) from a known power law, so that
the real scaling step fits them; the target run is a real Levanter training whose config names the
prediction (`prediction_path`), and a real evaluate step scores it, which the ladder view reads as the
achieved loss. `replay_run` is a step that replays a finished run's metrics in two gated parts, so a page
can watch a run view grow while its step runs.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from test_train import SOURCES, build_data, tiny_shape, train_config

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, versioned
from executor.store.layout import METRICS_FILE
from steps.evaluate.evaluate import EvaluateConfig, evaluate
from steps.filter.fasttext_quality import TrainClassifierConfig, train_quality_classifier
from steps.model.model_size import training_flops
from steps.scaling.ladder import predict_from_ladder
from steps.scaling.ladder_config import LadderConfig, LadderRung, LadderTarget
from steps.tokenize.cells import CellsConfig, build_cells
from steps.tokenize.mixture_weights import MixtureWeightsConfig, mixture_weights
from steps.tokenize.train_tokenizer import load_tokenizer
from steps.train.train import TrainConfig, train

TRAIN_STEPS = 8
BATCH = 8
TOPICS, BUCKETS = 4, 3
LAW_E, LAW_A, LAW_ALPHA = 5.6, 60.0, 0.25
RUNG_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class RungFiguresConfig:
    """What one trained and evaluated ladder rung leaves, computed from a known law."""

    compute: float
    tokens: float
    tokens_per_step: float
    offset: float
    """Added to the law's loss (the rung's own luck), so the fit has residuals."""
    output_path: str


def rung_figures(config: RungFiguresConfig) -> None:
    """Writes metrics.jsonl (per-component eval losses at fractions of training) and results.json (macro loss):
    a run at fraction f of its tokens scores as a run of f times its compute."""
    lines = []
    for fraction in RUNG_FRACTIONS:
        loss = LAW_E + LAW_A * (fraction * config.compute) ** -LAW_ALPHA + config.offset
        losses = {f"eval/{source}/loss": loss + (0.1 if index else -0.1) for index, source in enumerate(SOURCES)}
        step = round(fraction * config.tokens / config.tokens_per_step) - 1
        lines.append({"step": step, **losses, "eval/macro_loss": loss})
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    Path(config.output_path, METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    final = LAW_E + LAW_A * config.compute**-LAW_ALPHA + config.offset
    results = {"components": {source: {"loss": final} for source in SOURCES}, "macro_loss": final}
    Path(config.output_path, "results.json").write_text(json.dumps(results))


@dataclass(frozen=True)
class ReplayConfig:
    """Replays a finished run's metrics.jsonl in two parts, each released by a gate, so a page can watch it grow."""

    metrics_path: str
    prediction_path: str
    """The scaling step output whose curve the run view overlays (the field a train step names it by)."""
    gate: str
    output_path: str


REPLAY_GATES: dict[str, tuple[threading.Event, threading.Event]] = {}


def replay_run(config: ReplayConfig) -> None:
    lines = Path(config.metrics_path).read_text().splitlines(keepends=True)
    released, finish = REPLAY_GATES[config.gate]
    metrics = Path(config.output_path, METRICS_FILE)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    half = next(n for n, line in enumerate(lines) if json.loads(line).get("step") == TRAIN_STEPS // 2)
    metrics.write_text("".join(lines[:half]))
    if not released.wait(timeout=120):
        raise TimeoutError(f"gate {config.gate} never opened")
    with metrics.open("a") as handle:
        handle.writelines(lines[half:])
    if not finish.wait(timeout=120):
        raise TimeoutError(f"gate {config.gate} never closed")


def build_views_prefix(root: Path) -> dict[str, Any]:
    """Run the DAG of the module docstring on `<root>/prefix`; returns the prefix and each step's output path."""
    data = build_data(root / "data")
    prefix = root / "prefix"
    corpus = [str(root / "data" / "corpus" / source) for source in SOURCES]
    quality = ExecutorStep(name="quality/docstrings", fn=train_quality_classifier, config=TrainClassifierConfig(
        positive_paths=[corpus[1]], negative_paths=[corpus[0]], output_path=THIS_OUTPUT_PATH, dim=16, bucket=20_000,
        epochs=10))  # fmt: skip
    cells = ExecutorStep(name="cells/code", fn=build_cells, config=CellsConfig(
        input_paths=corpus, tokenizer_path=data["tokenizer"], output_path=THIS_OUTPUT_PATH,
        quality_model_path=output_path_of(quality), topics=versioned(TOPICS), quality_buckets=versioned(BUCKETS),
        sample_docs=60, vocab_size=2000, embedding_dim=8))  # fmt: skip
    weights = ExecutorStep(name="mixture/weights", fn=mixture_weights, config=MixtureWeightsConfig(
        composition_path=output_path_of(cells), output_path=THIS_OUTPUT_PATH, train_tokens=versioned(200_000),
        phase_fractions=versioned([0.8, 0.2]), quality_multipliers=versioned([[1, 1, 1], [0.25, 1, 4]])))  # fmt: skip

    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    shape = tiny_shape(vocab)
    tokens_per_step = BATCH * shape.seq_len
    target_tokens = TRAIN_STEPS * tokens_per_step
    target_compute = training_flops(shape, target_tokens)
    rungs, ladder = [], []
    for number, (scale, offset) in enumerate(((1 / 64, 0.02), (1 / 16, -0.03), (1 / 4, 0.01), (1 / 2, 0.0)), 1):
        compute, tokens = target_compute * scale, target_tokens * scale * 64
        rung = ExecutorStep(name=f"ladder/rung-d{number}", fn=rung_figures, config=RungFiguresConfig(
            compute=versioned(compute), tokens=versioned(tokens), tokens_per_step=versioned(tokens_per_step),
            offset=versioned(offset), output_path=THIS_OUTPUT_PATH))  # fmt: skip
        rungs.append(rung)
        ladder.append(
            LadderRung(
                name=f"d{number}",
                train_path=output_path_of(rung),
                evaluate_path=output_path_of(rung),
                flops=compute,
                tokens=tokens,
                tokens_per_step=tokens_per_step,
            )
        )
    scaling = ExecutorStep(name="scaling/tiny", fn=predict_from_ladder, config=LadderConfig(
        rungs=ladder, target=LadderTarget(name="tiny", flops=target_compute, tokens=target_tokens,
                                          tokens_per_step=tokens_per_step),
        output_path=THIS_OUTPUT_PATH, asymptote=versioned(LAW_E), bootstrap_samples=versioned(200)))  # fmt: skip
    fields = {name: getattr(train_config(data, "unused", num_train_steps=TRAIN_STEPS, steps_per_eval=4,
                                         checkpoint_every_steps=TRAIN_STEPS, watch_interval=2), name)
              for name in TrainConfig.__dataclass_fields__}  # fmt: skip
    fields.update(output_path=THIS_OUTPUT_PATH, shape=versioned(shape), num_train_steps=versioned(TRAIN_STEPS),
                  prediction_path=output_path_of(scaling))  # fmt: skip
    hero = ExecutorStep(name="train/tiny", fn=train, config=TrainConfig(**fields))
    evaluation = ExecutorStep(name="evaluate/tiny", fn=evaluate, config=EvaluateConfig(
        checkpoint_path=output_path_of(hero, "checkpoints"), shape=versioned(shape), tokenizer_path=data["tokenizer"],
        components={source: data[source] for source in SOURCES}, output_path=THIS_OUTPUT_PATH,
        max_batches=2))  # fmt: skip
    executor = Executor(str(prefix))
    executor.run([weights, evaluation], caller="experiments/views.py", description="the dashboard views' DAG")
    steps = {"quality": quality, "cells": cells, "weights": weights, "scaling": scaling, "train": hero,
             "evaluate": evaluation, **{f"rung{number}": rung for number, rung in enumerate(rungs, 1)}}  # fmt: skip
    paths = {key: executor.output_paths[step][len(str(prefix)) + 1 :] for key, step in steps.items()}
    return {"prefix": prefix, "paths": paths}
