"""What a train step says when its run diverges or cannot resume, where Levanter's errors say neither.

- Divergence: Levanter raises `RuntimeError("Loss is NaN")`. The message names the step, the last training
  step whose loss was finite (from metrics.jsonl), the last complete checkpoint (what a rerun would resume
  from, and diverge again), and what to try.
- A latest complete checkpoint that cannot be read (a tensor file cut short): Levanter's restore fails with
  tensorstore's error and every rerun would fail the same way. The damaged `step-N/` is moved aside, out of
  `checkpoints/` to `damaged-checkpoints/step-N-<time>/` (nothing is deleted), with a warning, and the step
  fails saying so: the next run (the executor's rerun) resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Iterator

from executor import storage
from steps.model.checkpoints import DamagedCheckpointError, latest_checkpoint
from steps.train.train_metrics import read_metrics

logger = logging.getLogger(__name__)

DAMAGED_FOLDER = "damaged-checkpoints"
"""Under the train step's output: checkpoints moved aside because they could not be read."""
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


@contextlib.contextmanager
def damaged_checkpoint_set_aside(label: str, output_path: str) -> Iterator[None]:
    """Move a checkpoint that failed to restore out of `checkpoints/`, and fail saying where it went."""
    try:
        yield
    except ValueError as error:  # tensorstore reports a failed read as a ValueError naming the file
        checkpoints = storage.join(output_path, "checkpoints")
        damaged = _checkpoint_named_in(checkpoints, str(error))
        if damaged is None:
            raise
        aside = storage.join(output_path, DAMAGED_FOLDER, f"{damaged}-{time.strftime('%Y%m%dT%H%M%S')}")
        storage.move_tree(storage.join(checkpoints, damaged), aside)
        try:
            previous = f"resumes from {latest_checkpoint(checkpoints, label)}"
        except FileNotFoundError:
            previous = "starts from step 0 (no other complete checkpoint)"
        message = (f"{label}: the checkpoint {checkpoints}/{damaged} cannot be read ({str(error)[:300]}); it is "
                   f"moved aside to {aside}, so a rerun of the step {previous}")  # fmt: skip
        logger.warning("%s", message)
        raise DamagedCheckpointError(message) from error


def _checkpoint_named_in(checkpoints: str, error: str) -> str | None:
    """The `step-N` folder under `checkpoints` that an error message names, if any."""
    for form in {checkpoints, checkpoints.split("://", 1)[-1]}:
        found = re.search(re.escape(form.rstrip("/")) + r"/(step-\d+)/", error)
        if found:
            return found.group(1)
    return None
