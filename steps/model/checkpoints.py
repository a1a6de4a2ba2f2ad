"""A train step's Levanter checkpoints: which one is the latest complete, and loading its model.

The evaluate step and the HF export read checkpoints through these two functions, so "latest complete"
means one thing for both: what Levanter's own `latest_checkpoint_path` finds.

Levanter skips a checkpoint whose `metadata.json` it cannot parse (it logs an error and goes on to an older
one), so a damaged latest checkpoint would silently be scored, exported or resumed from an older one.
`check_checkpoints` refuses that instead, naming the damaged file: its metadata is written last, so a
`metadata.json` that exists but does not parse is damage, not a checkpoint cut by a kill.
"""

from __future__ import annotations

import json

import jax
from haliax import Axis
from levanter.checkpoint import latest_checkpoint_path
from levanter.model_loading import load_levanter_checkpoint
from levanter.trainer import TrainerConfig

from executor import storage
from steps.model.moe_model import MoeConfig, MoeLMHeadModel

METADATA_FILE = "metadata.json"


class DamagedCheckpointError(ValueError):
    """A checkpoint Levanter would skip without saying so; the message names its file and what to do."""


def check_checkpoints(checkpoints_path: str, label: str) -> None:
    """Refuse a `checkpoints/` folder holding a checkpoint whose metadata.json exists but does not parse."""
    for name in (storage.basename(path) for path in storage.list_names(checkpoints_path)):
        if not name.startswith("step-"):
            continue
        folder = storage.join(checkpoints_path, name)
        metadata_path = storage.join(folder, METADATA_FILE)
        raw = storage.read_bytes(metadata_path)
        try:
            if raw is not None and not isinstance(json.loads(raw), dict):
                raise ValueError("not a JSON object")
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise DamagedCheckpointError(
                f"{label}: the checkpoint {folder} is damaged ({metadata_path}: {error}); Levanter would silently "
                f"use an older one. Move {folder} aside to use the previous complete checkpoint, or point "
                "checkpoint_path at the step-N folder you mean"
            ) from error


def latest_checkpoint(checkpoints_path: str, label: str) -> str:
    """The latest complete checkpoint under a train step's `checkpoints/` (or that `step-N/` itself)."""
    check_checkpoints(checkpoints_path, label)
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
