"""What a train step says when its run diverges: Levanter's `RuntimeError("Loss is NaN")` names nothing.

The message names the step, the last training step whose loss was finite (from metrics.jsonl), the last
complete checkpoint (what a rerun would resume from, and diverge again), and what to try.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from steps.model.checkpoints import latest_checkpoint
from steps.train.train_metrics import read_metrics

LEVANTER_DIVERGED = ("Loss is NaN", "Loss is Inf")
"""Levanter trainer's messages (levanter/trainer.py `train_step`) for a non-finite loss."""


class TrainingDivergedError(RuntimeError):
    """The training loss became NaN or infinite; the message says where and what to try."""


@contextlib.contextmanager
def divergence_explained(label: str, output_path: str, learning_rate: float) -> Iterator[None]:
    """Turn Levanter's bare non-finite-loss error into a TrainingDivergedError that says what to do."""
    try:
        yield
    except RuntimeError as error:
        if str(error) not in LEVANTER_DIVERGED:
            raise
        raise TrainingDivergedError(_message(label, output_path, learning_rate, str(error))) from error


def _message(label: str, output_path: str, learning_rate: float, what: str) -> str:
    finite = [record["step"] for record in read_metrics(output_path)
              if isinstance(record.get("train/loss"), float | int) and math.isfinite(record["train/loss"])]  # fmt: skip
    last_finite = f"step {max(finite)}" if finite else "no step (the first loss was already not finite)"
    checkpoints = f"{output_path}/checkpoints"
    try:
        checkpoint = latest_checkpoint(checkpoints, label)
        resume = f"the last complete checkpoint is {checkpoint} (a rerun resumes there and may diverge again)"
    except (FileNotFoundError, ValueError):
        checkpoint, resume = None, f"there is no complete checkpoint under {checkpoints}"
    fork = f"; or fork a run from {checkpoint} by copying it into a new run's checkpoints/" if checkpoint else ""
    return (f"{label}: the training loss diverged ({what}); the last finite train/loss in "
            f"{output_path}/metrics.jsonl is at {last_finite}; {resume}. Try a lower learning_rate (now "
            f"{learning_rate:g}), a longer warmup or gradient clipping{fork}")  # fmt: skip
