"""A train step's Levanter checkpoints: which one is the latest complete, and loading its model.

The evaluate step and the HF export read checkpoints through these two functions, so "latest complete"
means one thing for both: what Levanter's own `latest_checkpoint_path` finds.
"""

from __future__ import annotations

import jax
from haliax import Axis
from levanter.checkpoint import latest_checkpoint_path
from levanter.model_loading import load_levanter_checkpoint
from levanter.trainer import TrainerConfig

from steps.model.moe_model import MoeConfig, MoeLMHeadModel


def latest_checkpoint(checkpoints_path: str, label: str) -> str:
    """The latest complete checkpoint under a train step's `checkpoints/` (or that `step-N/` itself)."""
    try:
        checkpoint = latest_checkpoint_path(checkpoints_path)
    except FileNotFoundError:  # Levanter raises when it finds none (older versions returned None)
        checkpoint = None
    if checkpoint is None:
        raise FileNotFoundError(f"{label}: no complete checkpoint under {checkpoints_path}; train first")
    return checkpoint


def load_model(model_config: MoeConfig, checkpoint: str, vocab: Axis, trainer: TrainerConfig) -> MoeLMHeadModel:
    """The checkpoint's model, laid out on `trainer`'s mesh; call inside `trainer.use_device_mesh()`."""
    return load_levanter_checkpoint(
        model_config, checkpoint, Vocab=vocab, axis_mapping=trainer.parameter_axis_mapping, key=jax.random.PRNGKey(0)
    )
