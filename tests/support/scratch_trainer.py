"""Levanter's `TrainerConfig` as steps/train/train.py configures it, for the short runs of tests/*_run.py: f32,
no tracker, checkpoints and logs in a scratch folder. Import it after XLA_FLAGS is set (it loads JAX)."""

from __future__ import annotations

from pathlib import Path

import jmp
from levanter.checkpoint import CheckpointerConfig
from levanter.tracker import NoopConfig
from levanter.trainer import TrainerConfig
from levanter.utils.mesh import MeshConfig

from steps.train.parallelism import precision_policy


def scratch_trainer_config(
    scratch: str,
    run_id: str,
    mesh: MeshConfig,
    batch: int,
    steps: int,
    per_device_parallelism: int = -1,
    mp: jmp.Policy | None = None,
) -> TrainerConfig:
    """`mp`: the precision policy (None: the train step's f32, `precision_policy("float32")`)."""
    return TrainerConfig(
        mesh=mesh,
        mp=mp or precision_policy("float32"),
        train_batch_size=batch,
        per_device_parallelism=per_device_parallelism,
        num_train_steps=steps,
        tracker=NoopConfig(),
        id=run_id,
        log_dir=Path(scratch),
        checkpointer=CheckpointerConfig(base_path=scratch),
        require_accelerator=False,
        log_jaxprs=False,
        log_xla_hlo=False,
    )
