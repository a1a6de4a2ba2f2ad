"""The train step's checks of its data inputs, run before JAX compiles anything, and its explained failures.

Each names the step, the component or file, and what to do:

- a cache: its ledger must be a JSON object whose figures match the arrays of every part it lists
  (steps/tokenize/levanter_cache.py `verify_cache`: sizes, offsets, one read per stored file), and it must
  have been tokenized with the model's vocabulary;
- mixture weights: finite and not negative (`check_weights`, the one rule for a valid weight), and naming
  only components of the run. A weight on a name that is no component is refused, since a typo would
  otherwise train on a fraction of the intended mixture, unless tokenize listed that cell as left out
  (`excluded` in components.json): such weights are dropped, returned by name so that the step logs them and
  records them in `mixture.json` beside its metrics;
- the optimizer settings (steps/train/train_config.py's `check_optimizer_settings`), checked when the DAG is
  planned (`TrainConfig.check_settings`, called by executor/dag/plan.py, which names the step, its hash and path):
  Levanter takes these as given, so
  `num_train_steps=-1` "trains" to step -1 and writes a checkpoint, 0 fails deep in its optimizer setup, a
  negative learning rate climbs the loss and a NaN one is only seen after a compiled step.

Its explained failures, what a train step says when its run diverges or cannot resume (Levanter's errors say neither):

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
import json
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from executor import ConfigError, storage
from steps.model.checkpoints import DamagedCheckpointError, latest_checkpoint
from steps.tokenize.levanter_cache import CacheCheckError, read_ledger, verify_cache
from steps.tokenize.mixture_weights import WEIGHTS_FILE, Schedule, as_schedule, check_schedule, check_weights
from steps.tokenize.tokenize import COMPONENTS_FILE
from steps.train.train_config import TrainInputError
from steps.train.train_metrics import read_metrics

logger = logging.getLogger(__name__)

MIXTURE_FILE = "mixture.json"
"""Under the train step's output: the schedule it trains on and the weights it dropped (cells tokenize left out)."""


def check_cache(label: str, component: str, split_path: str, tokenizer_vocab: int, seq_len: int = 1) -> None:
    """Refuse a missing or damaged cache, one tokenized with another vocabulary, or one holding less than one
    sequence of `seq_len` tokens (Levanter reads no partial sequence, so it would be an empty dataset)."""
    try:
        ledger = read_ledger(split_path)
        tokens = verify_cache(split_path, ledger) if ledger is not None else 0
    except CacheCheckError as error:
        raise TrainInputError(f"{label}: component {component!r}: {error}") from error
    if ledger is None:
        raise TrainInputError(
            f"{label}: component {component!r} has no Levanter cache at {split_path} (no ledger); "
            "run its tokenize step first, or fix the path"
        )
    # Levanter's CacheLedger keeps the tokenizer's figures under metadata.preprocessor_metadata.
    cache_vocab = ((ledger.get("metadata") or {}).get("preprocessor_metadata") or {}).get("vocab_size")
    if cache_vocab is not None and cache_vocab != tokenizer_vocab:
        raise TrainInputError(
            f"{label}: component {component!r} at {split_path} was tokenized with a {cache_vocab}-token vocabulary "
            f"but the model's tokenizer has {tokenizer_vocab}; retokenize it with the model's tokenizer"
        )
    if tokens < seq_len:
        raise TrainInputError(
            f"{label}: component {component!r} at {split_path} holds {tokens} tokens, less than one sequence of "
            f"{seq_len}; give it more documents, or leave it out of the run's components"
        )


def checked_weights(where: str, weights: Any, fix: str) -> dict[str, float]:
    """`weights` as a dict of finite, non-negative floats; TrainInputError naming `where` and saying `fix` if not."""
    if not isinstance(weights, Mapping):
        raise TrainInputError(f"{where}: the weights are a {type(weights).__name__}, not component -> weight; {fix}")
    try:
        check_weights(weights, where)
    except ConfigError as error:
        raise TrainInputError(f"{error}; {fix}") from error
    return {name: float(weight) for name, weight in weights.items()}


def given_schedule(label: str, weights: Any, components: Collection[str]) -> Schedule:
    """The step's own `weights` as a schedule: a dict (every component named) is one phase from step 0; a list
    `[(start_step, weights), ...]` may start a phase at any step and leave components out (weight 0)."""
    fix = "fix the step's weights"
    if isinstance(weights, Mapping):
        if set(weights) != set(components):
            raise TrainInputError(f"{label}: weights name {sorted(weights)} but the components are "
                                  f"{sorted(components)}")  # fmt: skip
        return [(0, checked_weights(f"{label}: weights", weights, fix))]
    try:
        schedule = as_schedule(weights)
        check_schedule(schedule, list(components), f"{label}: weights")
    except (ConfigError, TypeError, ValueError) as error:
        raise TrainInputError(f"{label}: the weights are not a mixture schedule [(start_step, weights), ...] over "
                              f"the components {sorted(components)}: {error}; {fix}") from error  # fmt: skip
    return [(start, checked_weights(f"{label}: weights from step {start}", phase, fix)) for start, phase in schedule]


def restarted(label: str, schedule: Schedule, phase_steps: Sequence[int] | None) -> Schedule:
    """`schedule` with its later phases starting at `phase_steps` (None: as it is), or TrainInputError."""
    if phase_steps is None:
        return schedule
    if len(phase_steps) != len(schedule) - 1:
        raise TrainInputError(f"{label}: phase_steps {list(phase_steps)} give {len(phase_steps)} starts for the "
                              f"{len(schedule) - 1} phases after the first; give one step per later phase")  # fmt: skip
    later = [(step, weights) for step, (_, weights) in zip(phase_steps, schedule[1:], strict=True)]
    moved = [(0, schedule[0][1]), *later]
    try:
        check_schedule(moved, [name for _, weights in moved for name in weights], f"{label}: phase_steps")
    except ConfigError as error:
        raise TrainInputError(f"{error}; list increasing steps after 0") from error
    return moved


def checked_skips(label: str, skip_batches: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """`skip_batches` as sorted, disjoint [first step, end step) ranges of whole numbers, or TrainInputError."""
    ranges: list[tuple[int, int]] = []
    for item in skip_batches:
        if len(item) != 2 or not all(isinstance(step, int) and not isinstance(step, bool) for step in item):
            raise TrainInputError(f"{label}: skip_batches entry {item!r} is not a (first step, end step) pair of "
                                  "integers; give e.g. ((1200, 1250),)")  # fmt: skip
        first, end = item
        if not 0 <= first < end:
            raise TrainInputError(f"{label}: skip_batches entry {item!r} is no range of steps: it needs "
                                  "0 <= first < end (end excluded)")  # fmt: skip
        if ranges and first < ranges[-1][1]:
            raise TrainInputError(f"{label}: skip_batches {list(skip_batches)} overlap or are out of order; list "
                                  "disjoint ranges by increasing step")  # fmt: skip
        ranges.append((first, end))
    return ranges


def phase_weights(
    where: str, weights: Mapping[str, float], components: Collection[str], excluded: Collection[str], fix: str
) -> tuple[dict[str, float], dict[str, float]]:
    """A phase's weight per component (0 where it gives none) and the positive weights it puts on cells tokenize
    left out; a positive weight on any other name is refused."""
    strays = {name: weight for name, weight in weights.items() if name not in components and weight > 0}
    unknown = sorted(name for name in strays if name not in excluded)
    if unknown:
        raise TrainInputError(
            f"{where}: weights {unknown} name no component of this run (components: {sorted(components)}; left out "
            f"by tokenize: {sorted(excluded)}), so their share would silently go to the others; {fix}"
        )
    dropped = {name: weight for name, weight in strays.items() if name in excluded}
    return {name: weights.get(name, 0.0) for name in components}, dropped


def weights_file_schedule(
    label: str,
    weights_path: str,
    components: Collection[str],
    excluded: Collection[str],
    phase_start_step: Callable[[float], int],
) -> tuple[Schedule, dict[str, list[float]]]:
    """The schedule a mixture_weights output gives over `components` (each later phase starting at
    `phase_start_step(fraction of the run before it)`), and the weights per phase dropped on `excluded` cells."""
    weights_file = storage.join(weights_path, WEIGHTS_FILE)
    phases = storage.read_json(weights_file)
    if phases is None:
        raise TrainInputError(f"{label}: no {WEIGHTS_FILE} under {weights_path}; run the mixture_weights step first")
    fix = f"fix {weights_file} or rerun its mixture_weights step (--force_run)"
    if not isinstance(phases, dict) or not isinstance(phases.get("phases"), list) or not phases["phases"]:
        found = phases.get("phases") if isinstance(phases, dict) else phases
        raise TrainInputError(f"{label}: {weights_file} lists no phases ({json.dumps(found)}): a run needs at "
                              f"least one phase of weights; {fix}")  # fmt: skip
    schedule: Schedule = []
    dropped: dict[str, list[float]] = {}
    ended = 0.0
    for number, phase in enumerate(phases["phases"]):
        start = 0 if number == 0 else phase_start_step(ended)
        ended += phase["fraction"]
        where = f"{label}: phase {number + 1} of {weights_file}"
        weights = checked_weights(where, phase["weights"], fix)
        kept, left_out = phase_weights(where, weights, components, excluded, fix)
        for name, weight in left_out.items():
            dropped.setdefault(name, [0.0] * len(phases["phases"]))[number] = weight
        if sum(kept.values()) <= 0:
            raise TrainInputError(f"{label}: phase {number + 1} of {weights_path} weighs none of the components "
                                  f"{sorted(components)}")  # fmt: skip
        schedule.append((start, kept))
    return schedule, dropped


def excluded_cells(components_path: str | None) -> list[str]:
    """The cells a `per_folder` tokenize output left out (no documents in a split), from its components.json."""
    if components_path is None:
        return []
    document = storage.read_json(storage.join(components_path, COMPONENTS_FILE)) or {}
    return sorted(document.get("excluded") or {})


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
