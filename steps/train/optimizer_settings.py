"""The optimizer's settings, as a train config holds them: which optimizer (`OPTIMIZERS`), the hero optimizer's
rates and betas (`HeroHyperparameters`) and the heuristic that derives them from a run's compute (`MoeHeuristic`).

Plain data and arithmetic, importing neither JAX nor Levanter, so that a DAG's definition and its plan (the
planner's `TrainConfig.check_settings`) do not load them; steps/train/optimizer.py builds the optimizers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPTIMIZERS = ("adamw", "hero")
"""`TrainConfig.optimizer`'s choices."""


@dataclass(frozen=True)
class HeroHyperparameters:
    """The `hero` optimizer's settings (`MoeHeuristic` derives them from a run's compute). Versioned."""

    adam_lr: float
    """Peak learning rate of the Adam group."""
    muonh_lr: float
    """Peak step of the MuonH group, as a share of each matrix's norm."""
    adamh_lr: float
    """Peak step of the AdamH readout, as a share of its norm."""
    beta1: float = 0.9062
    """Adam's and AdamH's first-moment decay."""
    beta2: float = 0.95
    """Adam's and AdamH's second-moment decay."""
    epsilon: float = 1e-8
    """Adam's and AdamH's denominator epsilon."""
    momentum: float = 0.95
    """MuonH's (Nesterov) momentum."""
    newton_schulz_steps: int = 5
    """Newton-Schulz steps of each MuonH update."""
    newton_schulz_coefficients: str = "quintic"
    """Which of Levanter's `NEWTON_SCHULZ_COEFFICIENTS` schedules the steps take their (a, b, c) from, step i
    the i-th triple (cyclically): "quintic" (the hero's, Levanter's default: five triples), "simple" (one
    triple, Muon's), "polar_express" or "aol"."""
    newton_schulz_epsilon: float = 1e-8
    """Added to the Frobenius norm each matrix is divided by before the iteration (Levanter's `muon_epsilon`)."""
    max_grad_norm: float | None = None
    """Global gradient-norm clip before every group (None, the published hero's: none)."""

    def __post_init__(self) -> None:
        if self.newton_schulz_coefficients not in NEWTON_SCHULZ_SCHEDULES:
            raise ValueError(
                f"newton_schulz_coefficients={self.newton_schulz_coefficients!r} is none of Levanter's "
                f"{sorted(NEWTON_SCHULZ_SCHEDULES)}"
            )


@dataclass(frozen=True)
class MoeHeuristic:
    """Optimizer hyperparameters from a run's compute: the hero's heuristic (marin issue #8435), its constants
    overridable. Versioned through what it derives.

    Each rung of a ladder and the hero get their own rates, epsilon and beta2 from their own token budget `T`,
    batch `B` (tokens per step) and width `d` (d_model), by one formula family:

        rate     = 0.06602 * T^-0.395 * d^-0.150 * sqrt(B)
        adam_lr  = min(rate, 0.05)
        muonh_lr = adamh_lr = min(13/3 * rate, 0.05)
        epsilon  = 9.676e-18 * sqrt(T / B)
        beta2    = clip(0.999^(B / 131072), 0.95, 0.9999),  beta1 = 0.9062

    with a linear decay to 5% of the peak. The cap holds every group's rate, as published: the MuonH and AdamH
    rates reach it first (at the tiny hero's d768 rung, 13/3 x 0.01226 = 0.0531 is trained at 0.05). The
    constants are Marin's published ones; a refit is a new `version` (and so a new hash for every run that uses
    it: the derived figures are what the train steps hash).
    For example a run of 2^30 tokens in steps of 2^20 at d_model 2048 gets adam_lr 0.00584, muonh_lr 0.0253,
    beta2 0.9920 and epsilon 3.1e-16: `MoeHeuristic().hyperparameters(2**30, 2**20, 2048)`.
    """

    version: str = "marin-8435"
    """Which constants these are; change it with any constant."""
    lr_coefficient: float = 0.06602
    tokens_exponent: float = -0.395
    width_exponent: float = -0.150
    max_lr: float = 0.05
    """The highest peak rate of any group (Adam's, MuonH's and AdamH's alike)."""
    muonh_over_adam: float = 13 / 3
    epsilon_coefficient: float = 9.676e-18
    beta2_base: float = 0.999
    beta2_reference_batch: int = 131_072
    """Tokens per step at which beta2 is `beta2_base`; beta2 is per token, so a batch of B tokens takes its
    B / reference-th power."""
    beta2_range: tuple[float, float] = (0.95, 0.9999)
    beta1: float = 0.9062
    min_lr_ratio: float = 0.05
    """The linear decay's end, over the peak."""
    lr_schedule: str = "linear"

    def uncapped_adam_lr(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> float:
        """The formula's Adam rate before the cap (`max_lr`)."""
        rate = self.lr_coefficient * tokens**self.tokens_exponent * hidden_dim**self.width_exponent
        return rate * math.sqrt(tokens_per_batch)

    def hyperparameters(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> HeroHyperparameters:
        """The hero optimizer's settings for a run of `tokens` tokens in steps of `tokens_per_batch`, width
        `hidden_dim`."""
        if tokens <= 0 or tokens_per_batch <= 0 or hidden_dim <= 0:
            raise ValueError(
                f"MoeHeuristic needs positive tokens, batch and width, got tokens={tokens}, "
                f"tokens_per_batch={tokens_per_batch}, hidden_dim={hidden_dim}"
            )
        rate = self.uncapped_adam_lr(tokens, tokens_per_batch, hidden_dim)
        matrix_rate = min(self.muonh_over_adam * rate, self.max_lr)
        low, high = self.beta2_range
        return HeroHyperparameters(
            adam_lr=min(rate, self.max_lr),
            muonh_lr=matrix_rate,
            adamh_lr=matrix_rate,
            beta1=self.beta1,
            beta2=min(max(self.beta2_base ** (tokens_per_batch / self.beta2_reference_batch), low), high),
            epsilon=self.epsilon_coefficient * math.sqrt(tokens / tokens_per_batch),
        )


NEWTON_SCHULZ_SCHEDULES = ("aol", "polar_express", "quintic", "simple")
"""The names of Levanter's `NEWTON_SCHULZ_COEFFICIENTS` schedules (levanter/optim/util.py), whose triples
steps/train/optimizer.py reads from Levanter itself; tests/steps/train/test_optimizer.py holds these names to
Levanter's table."""


def check_optimizer(name: str, hero: HeroHyperparameters | None) -> None:
    """Refuse an optimizer the train step cannot build: an unknown name, or `hero` without its settings."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r} is none of {OPTIMIZERS}")
    if name == "hero" and hero is None:
        raise ValueError("optimizer='hero' needs hero_hyperparameters (`MoeHeuristic` derives them)")
