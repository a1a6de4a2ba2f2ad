"""Mixture weights: checked by hand or computed from token counts under a per-cell exposure cap.

A mixture is a schedule of phases `[(start_step, {component: weight}), ...]` (a plain dict is one
phase from step 0). `check_schedule` is the one place that says what a valid schedule is: a first
phase at step 0, increasing starts, weights that are finite, not negative and not all zero. Levanter
checks some of this with `assert`s deep inside the data loader, at training time; here it fails
when the DAG is built, with the component and phase named.

The `mixture_weights` step computes weights for cells (or sources) from their token counts, as the
hero run did: each phase trains on a fraction of `train_tokens`; within a phase a cell's weight is
proportional to its tokens times its quality bucket's multiplier (upweighting the best buckets in
the cooldown), except that no cell may be seen more than `max_epochs` times over the whole run.
Capped cells are held at their remaining budget and the rest of the phase is shared out among the
others by the same rule (water-filling), so the cap never starves a phase. Cells without tokens get
weight 0 and are listed under `empty`. The hero capped at 8 epochs; its most-repeated cell reached
about 2.1.

Output: `weights.json` with, per phase, its share of the tokens and the weights; each cell's
expected epochs; the cells the cap bound; the empty cells.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor import ConfigError, storage

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "weights.json"
Schedule = list[tuple[int, dict[str, float]]]


def as_schedule(weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]) -> Schedule:
    """A dict of weights is one phase from step 0."""
    if isinstance(weights, Mapping):
        return [(0, dict(weights))]
    return [(start, dict(phase)) for start, phase in weights]


def check_schedule(schedule: Schedule, components: Sequence[str], where: str) -> None:
    """Raise `ConfigError` naming `where` (the function or step) for a schedule Levanter would reject or
    silently misread."""
    if not schedule:
        raise ConfigError(f"{where}: the mixture has no phase; give weights or [(0, weights), ...]")
    if schedule[0][0] != 0:
        raise ConfigError(f"{where}: the first phase starts at step {schedule[0][0]}, not 0; "
                          "the first phase must start at step 0")  # fmt: skip
    for number, (start, weights) in enumerate(schedule, start=1):
        if number > 1 and start <= schedule[number - 2][0]:
            raise ConfigError(f"{where}: phase {number} starts at step {start}, not after phase {number - 1} "
                              f"(step {schedule[number - 2][0]}); list phases in increasing start order")  # fmt: skip
        unknown = sorted(set(weights) - set(components))
        if unknown:
            raise ConfigError(f"{where}: phase {number} weights {unknown}, which are not components "
                              f"(components: {sorted(components)})")  # fmt: skip
        check_weights(weights, f"{where}: phase {number}")


def check_weights(weights: Mapping[str, float], where: str) -> None:
    for name, weight in weights.items():
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not math.isfinite(weight):
            raise ConfigError(f"{where}: the weight of {name!r} is {weight!r}, not a finite number")
        if weight < 0:
            raise ConfigError(f"{where}: the weight of {name!r} is negative ({weight}); weights must be >= 0")
    if sum(weights.values()) <= 0:
        raise ConfigError(f"{where}: the weights sum to 0, so nothing would be trained on; "
                          "give at least one component a positive weight")  # fmt: skip


def phase_start(num_train_steps: int, fraction: float, batch_size: int, mixture_block_size: int) -> int:
    """The step nearest `fraction` of the run at which a phase may start: Levanter's mixture changes
    weights only at whole blocks of `mixture_block_size` sequences, so `step * batch_size` must be a
    multiple of it (the hero: 80% of 390,251 steps at batch 11,264 -> step 312,200)."""
    if not 0 < fraction < 1:
        raise ConfigError(f"phase_start: fraction must be in (0, 1), got {fraction}")
    stride = mixture_block_size // math.gcd(batch_size, mixture_block_size)
    step = round(num_train_steps * fraction / stride) * stride
    if not 0 < step < num_train_steps:
        raise ConfigError(f"phase_start: no block-aligned step near {fraction:.0%} of {num_train_steps} steps "
                          f"(batch {batch_size}, block {mixture_block_size}); train longer or use a smaller "
                          "mixture block")  # fmt: skip
    return step


def load_schedule(weights_path: str, phase_starts: Sequence[int]) -> Schedule:
    """The schedule a mixture_weights output describes, its phases starting at `phase_starts` (training steps;
    see `phase_start`): what a training step passes to `lm_mixture_data_config` once the weights exist."""
    result = storage.read_json(storage.join(weights_path, WEIGHTS_FILE))
    if result is None:
        raise FileNotFoundError(f"no {WEIGHTS_FILE} under {weights_path}; point it at a mixture_weights step output")
    if len(phase_starts) != len(result["phases"]):
        phases = len(result["phases"])
        raise ConfigError(f"{weights_path} has {phases} phases, but {len(phase_starts)} phase starts were given")
    return [(start, phase["weights"]) for start, phase in zip(phase_starts, result["phases"], strict=True)]


@dataclass(frozen=True)
class MixtureWeightsConfig:
    composition_path: str
    """A cells step output (its composition.json: tokens and quality bucket per cell), or any folder
    whose composition.json has `{"cells": {name: {"tokens": n}}}` (sources). A dependency."""
    output_path: str
    """Where weights.json goes (THIS_OUTPUT_PATH in a DAG)."""
    train_tokens: int
    """Tokens the run trains on, all phases together. Versioned."""
    max_epochs: float = 8.0
    """No cell is trained on more than this many times its tokens over the run. Versioned."""
    phase_fractions: list[float] = field(default_factory=lambda: [1.0])
    """Each phase's share of train_tokens, in order; they sum to 1 (the hero: [0.8, 0.2]). Versioned."""
    quality_multipliers: list[list[float]] = field(default_factory=list)
    """Per phase, a weight multiplier per quality bucket (bucket 0 lowest); empty: all 1. Versioned."""


def mixture_weights(config: MixtureWeightsConfig) -> None:
    where = f"mixture_weights step at {config.output_path}"
    composition = storage.read_json(storage.join(config.composition_path, "composition.json"))
    if composition is None:
        raise FileNotFoundError(f"{where}: no composition.json under {config.composition_path}; "
                                "point composition_path at a cells step output")  # fmt: skip
    cells = composition["cells"]
    tokens = {name: int(cell["tokens"]) for name, cell in cells.items()}
    _check_config(config, where, sum(tokens.values()))
    budget = {name: config.max_epochs * count for name, count in tokens.items()}
    phases, capped = [], []
    for number, fraction in enumerate(config.phase_fractions):
        multipliers = config.quality_multipliers[number] if config.quality_multipliers else []
        desired = {name: tokens[name] * _multiplier(cells[name], multipliers) for name in cells}
        allocation, bound = _water_fill(desired, budget, fraction * config.train_tokens, f"{where}: phase {number + 1}")
        budget = {name: budget[name] - allocation[name] for name in budget}
        phase_tokens = fraction * config.train_tokens
        phases.append({"fraction": fraction, "tokens": phase_tokens,
                       "weights": {name: allocation[name] / phase_tokens for name in cells}})  # fmt: skip
        capped.append(sorted(bound))
    seen = {name: config.max_epochs * count - budget[name] for name, count in tokens.items()}
    epochs = {name: seen[name] / count if count else 0.0 for name, count in tokens.items()}
    result: dict[str, Any] = {
        "phases": phases, "expected_epochs": epochs, "max_expected_epochs": max(epochs.values(), default=0.0),
        "max_epochs": config.max_epochs, "capped": capped, "train_tokens": config.train_tokens,
        "empty": sorted(name for name, count in tokens.items() if count == 0),
    }  # fmt: skip
    storage.write_json_atomic(storage.join(config.output_path, WEIGHTS_FILE), result)
    logger.info("%s: %d cells, max expected epochs %.2f (cap %g), %d empty", where, len(cells),
                result["max_expected_epochs"], config.max_epochs, len(result["empty"]))  # fmt: skip


def _check_config(config: MixtureWeightsConfig, where: str, corpus_tokens: int) -> None:
    if config.train_tokens <= 0 or config.max_epochs <= 0:
        raise ConfigError(f"{where}: train_tokens and max_epochs must be positive")
    if not config.phase_fractions or any(f <= 0 for f in config.phase_fractions):
        raise ConfigError(f"{where}: phase_fractions must be positive, got {config.phase_fractions}")
    if not math.isclose(sum(config.phase_fractions), 1.0, rel_tol=1e-9):
        raise ConfigError(f"{where}: phase_fractions sum to {sum(config.phase_fractions)}, not 1")
    if config.quality_multipliers and len(config.quality_multipliers) != len(config.phase_fractions):
        raise ConfigError(f"{where}: give quality_multipliers for each of the {len(config.phase_fractions)} phases")
    for multipliers in config.quality_multipliers:
        check_weights(dict(enumerate(map(float, multipliers))), f"{where}: quality_multipliers")  # type: ignore[arg-type]
    if corpus_tokens == 0:
        raise ConfigError(f"{where}: every cell is empty (0 tokens); nothing to weigh")
    if config.train_tokens > config.max_epochs * corpus_tokens:
        raise ConfigError(f"{where}: {config.train_tokens} training tokens need more than max_epochs="
                          f"{config.max_epochs} passes over the {corpus_tokens} tokens of the corpus; "
                          "raise max_epochs or add data")  # fmt: skip


def _multiplier(cell: Mapping[str, Any], multipliers: Sequence[float]) -> float:
    bucket = cell.get("quality_bucket")
    return float(multipliers[bucket]) if multipliers and bucket is not None else 1.0


def _water_fill(desired: Mapping[str, float], budget: Mapping[str, float], total: float,
                where: str) -> tuple[dict[str, float], set[str]]:  # fmt: skip
    """Split `total` in proportion to `desired`, no name over its `budget`; returns the split and the capped names."""
    capped: set[str] = set()
    while True:
        free = {name: want for name, want in desired.items() if name not in capped and want > 0}
        remaining = total - sum(budget[name] for name in capped)
        if not free or remaining <= 0:
            raise ConfigError(f"{where}: the exposure cap leaves no room for this phase's tokens "
                              "(its multipliers put all weight on capped cells); raise max_epochs or the multipliers "
                              "of other buckets")  # fmt: skip
        scale = remaining / sum(free.values())
        over = {name for name, want in free.items() if want * scale > budget[name]}
        if not over:
            split = {name: (budget[name] if name in capped else free.get(name, 0.0) * scale) for name in desired}
            return split, capped
        capped |= over
