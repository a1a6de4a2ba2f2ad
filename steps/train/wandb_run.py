"""The train step's wandb run: it names its executor step, and a fork is a wandb fork of its parent's run.

    wandb_config("moe-train", "gs://b/train/fork-1a2b3c4d", "gs://b/train/hero-5e6f7a8b/checkpoints/step-12000")

The run id is the step's output folder name (`fork-1a2b3c4d`), so it is the same on every attempt and a
resumed step continues its own wandb run. Its config carries `executor/step`, `executor/hash` and
`executor/output_path` (from the `.executor_info` the executor wrote before calling the step), and a fork's
`executor/parent` and `executor/fork_step`. On a fork's first start (no checkpoint of its own yet) wandb's
`fork_from="<parent run id>?_step=N"` is set, so the public project draws the lineage too; a resumed fork
omits it (wandb refuses `fork_from` with `resume`) and resumes its own run. Runs are offline unless
WANDB_MODE says otherwise; `python -m executor wandb-sync <step output path>` uploads them later.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import wandb
from levanter.tracker import Tracker, TrackerConfig
from levanter.tracker.wandb import WandbConfig

from executor import storage
from executor.status import INFO_FILE
from steps.train.lineage import lineage_of

CHECKPOINTS = "checkpoints"


@TrackerConfig.register_subclass("executor_wandb")
@dataclasses.dataclass
class StepWandbConfig(WandbConfig):
    """Levanter's wandb tracker, plus the executor step's identity in the run's config."""

    step_config: dict[str, str] = dataclasses.field(default_factory=dict)
    """Added to the wandb run's config once it starts (`executor/step`, `executor/hash`, ...)."""

    def init(self, run_id: str | None) -> Tracker:
        tracker = super().init(run_id)
        if wandb.run is not None:  # the run this init started (Levanter may wrap its tracker in a background one)
            wandb.run.config.update(self.step_config, allow_val_change=True)
        return tracker


def has_own_checkpoint(output_path: str) -> bool:
    folder = storage.join(output_path, CHECKPOINTS)
    return storage.exists(folder) and any(name.startswith("step-") for name in storage.list_names(folder))


def wandb_config(project: str, output_path: str, initialize_from: str | None) -> StepWandbConfig:
    run_id = storage.basename(output_path)
    info: dict[str, Any] = storage.read_json(storage.join(output_path, INFO_FILE)) or {}
    identity = {"executor/step": str(info.get("name", run_id)), "executor/hash": str(info.get("hash", "")),
                "executor/output_path": output_path}  # fmt: skip
    fork_from = None
    if initialize_from is not None:
        lineage = lineage_of(initialize_from)
        identity |= {"executor/parent": str(lineage["parent"]), "executor/fork_step": str(lineage["step"])}
        if lineage["parent"] and lineage["step"] is not None and not has_own_checkpoint(output_path):
            fork_from = f"{storage.basename(lineage['parent'])}?_step={lineage['step']}"
    return StepWandbConfig(project=project, id=run_id, name=run_id, save_code=False, fork_from=fork_from,
                           step_config=identity)  # fmt: skip
