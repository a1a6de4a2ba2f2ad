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
OCDBT_PARTS = ("manifest.ocdbt", "d")
"""What a Levanter checkpoint's OCDBT database is made of, at the checkpoint's root."""


class DamagedCheckpointError(ValueError):
    """A checkpoint Levanter would skip without saying so; the message names its file and what to do."""


def check_checkpoints(checkpoints_path: str, label: str) -> None:
    """Refuse a `checkpoints/` folder holding a checkpoint whose metadata.json exists but does not parse, a
    complete checkpoint missing half of its OCDBT database, or a `step-N` that is a file."""
    for entry in storage.list_details(checkpoints_path):
        name = entry["name"]
        if not name.startswith("step-"):
            continue
        folder = storage.join(checkpoints_path, name)
        move_aside = (
            f"Move {folder} aside to use the previous complete checkpoint, or point checkpoint_path at the step-N "
            "folder you mean"
        )
        if entry.get("type") != "directory":
            raise DamagedCheckpointError(f"{label}: {folder} is a file, not a checkpoint folder. {move_aside}")
        metadata_path = storage.join(folder, METADATA_FILE)
        raw = storage.read_bytes(metadata_path)
        try:
            if raw is not None and not isinstance(json.loads(raw), dict):
                raise ValueError("not a JSON object")
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise DamagedCheckpointError(
                f"{label}: the checkpoint {folder} is damaged ({metadata_path}: {error}); Levanter would silently "
                f"use an older one. {move_aside}"
            ) from error
        if raw is not None:
            _check_database(folder, label, move_aside)


def _check_database(folder: str, label: str, move_aside: str) -> None:
    """A complete checkpoint's arrays live in one OCDBT database at its root: `manifest.ocdbt` and the `d/`
    folder it indexes. With one of them gone tensorstore fails with a page of its own internals; say which."""
    present = set(storage.list_names(folder))
    missing = [part for part in OCDBT_PARTS if part not in present]
    if len(missing) == 1:  # both absent: a checkpoint of another layout, which Levanter reads its own way
        raise DamagedCheckpointError(
            f"{label}: the checkpoint {folder} is damaged: its {missing[0]} is missing (a complete checkpoint holds "
            f"{' and '.join(OCDBT_PARTS)}). {move_aside}"
        )


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
