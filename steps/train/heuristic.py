"""Optimizer hyperparameters from a run's compute: the hero's `MoeHeuristic` (marin issue #8435).

Each rung of a ladder and the hero get their own rates, epsilon and beta2 from their own token budget `T`,
batch `B` (tokens per step) and width `d` (d_model), by one formula family:

    adam_lr  = min(0.06602 * T^-0.395 * d^-0.150 * sqrt(B), 0.05)
    muonh_lr = adamh_lr = 13/3 * adam_lr
    epsilon  = 9.676e-18 * sqrt(T / B)
    beta2    = clip(0.999^(B / 131072), 0.95, 0.9999),  beta1 = 0.9062

with a linear decay to 5% of the peak. The constants are Marin's published ones; a refit is a new `version`
(and so a new hash for every run that uses it: the derived figures are what the train steps hash).
For example a run of 2^30 tokens in steps of 2^20 at d_model 2048 gets adam_lr 0.00584, muonh_lr 0.0253,
beta2 0.9920 and epsilon 3.1e-16: `MoeHeuristic().hyperparameters(2**30, 2**20, 2048)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from steps.train.optimizer import HeroHyperparameters


@dataclass(frozen=True)
class MoeHeuristic:
    """The formula family (module docstring), its constants overridable. Versioned through what it derives."""

    version: str = "marin-8435"
    """Which constants these are; change it with any constant."""
    lr_coefficient: float = 0.06602
    tokens_exponent: float = -0.395
    width_exponent: float = -0.150
    max_adam_lr: float = 0.05
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

    def adam_lr(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> float:
        rate = self.lr_coefficient * tokens**self.tokens_exponent * hidden_dim**self.width_exponent
        return min(rate * math.sqrt(tokens_per_batch), self.max_adam_lr)

    def hyperparameters(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> HeroHyperparameters:
        """The hero optimizer's settings for a run of `tokens` tokens in steps of `tokens_per_batch`, width
        `hidden_dim`."""
        if tokens <= 0 or tokens_per_batch <= 0 or hidden_dim <= 0:
            raise ValueError(
                f"MoeHeuristic needs positive tokens, batch and width, got tokens={tokens}, "
                f"tokens_per_batch={tokens_per_batch}, hidden_dim={hidden_dim}"
            )
        adam_lr = self.adam_lr(tokens, tokens_per_batch, hidden_dim)
        low, high = self.beta2_range
        return HeroHyperparameters(
            adam_lr=adam_lr,
            muonh_lr=self.muonh_over_adam * adam_lr,
            adamh_lr=self.muonh_over_adam * adam_lr,
            beta1=self.beta1,
            beta2=min(max(self.beta2_base ** (tokens_per_batch / self.beta2_reference_batch), low), high),
            epsilon=self.epsilon_coefficient * math.sqrt(tokens / tokens_per_batch),
        )
