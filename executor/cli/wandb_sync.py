"""`python -m executor wandb-sync <step output path>`: upload a train step's offline wandb runs.

A train step runs wandb offline (its cluster may have no network) and leaves the run files under its
output path, `wandb/wandb/offline-run-*` (steps/train/train_metrics.py names the run after the step and puts the
step's name, hash and output path in its config; a fork carries wandb's `fork_from`). This command finds those
folders, on a local disk or in a bucket (copied to a temporary folder first), and hands each to `wandb sync`,
which uploads it when the network and WANDB_API_KEY allow. It knows nothing of training: the executor never
imports steps/.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile

from executor.store import storage
from executor.store.layout import WANDB_RUNS_DIR

logger = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 1800


class WandbSyncError(RuntimeError):
    """There is no offline run to upload, or `wandb sync` failed; the message names the folder and what to do."""


def offline_runs(output_path: str) -> list[str]:
    folder = storage.join(output_path, WANDB_RUNS_DIR)
    return [storage.join(folder, name) for name in storage.list_names(folder) if name.startswith("offline-run-")]


def _wandb_command() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "wandb")
    found = beside if os.path.exists(beside) else shutil.which("wandb")
    if found is None:
        raise WandbSyncError("the `wandb` command is not installed here (pip install wandb)")
    return found


def sync_step(output_path: str) -> list[str]:
    """`wandb sync` every offline run of the step at `output_path`; returns the runs uploaded."""
    output_path = storage.make_absolute(output_path)
    runs = offline_runs(output_path)
    if not runs:
        raise WandbSyncError(
            f"no offline wandb run under {storage.join(output_path, WANDB_RUNS_DIR)}: give the output path of a train "
            "step that has run (it writes its wandb files there)"
        )
    command = _wandb_command()
    with tempfile.TemporaryDirectory(prefix="wandb-sync-") as scratch:
        for run in runs:
            local = run
            if not storage.on_local_disk(run):
                fs, fs_path = storage.filesystem(run)
                local = os.path.join(scratch, storage.basename(run))
                fs.get(fs_path, local, recursive=True)
            result = subprocess.run(
                [command, "sync", "--include-offline", local],
                capture_output=True,
                text=True,
                timeout=SYNC_TIMEOUT_S,
                check=False,
            )
            if result.returncode != 0:
                said = (result.stderr or result.stdout).strip().splitlines()[-3:]
                raise WandbSyncError(
                    f"wandb sync of {run} failed (exit {result.returncode}): {' / '.join(said)}; check WANDB_API_KEY "
                    "and the network, then run this command again (a synced run is not uploaded twice)"
                )
            logger.info("uploaded %s", run)
    return runs
