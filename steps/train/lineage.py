"""A fork's lineage: which run, and which of its checkpoints, a train step started from.

    record_lineage(output_path, "gs://b/train/hero-1a2b3c4d/checkpoints/step-12000")
    # <output_path>/lineage.json: {"parent": "gs://b/train/hero-1a2b3c4d", "step": 12000, "checkpoint": ...}

The run view (executor/dashboard/panels.py) reads it to draw the parent's loss up to that step beside the
fork's; wandb's offline run carries the same two figures in its config.
"""

from __future__ import annotations

from typing import Any

from executor import storage
from executor.status import LINEAGE_FILE

CHECKPOINTS = "/checkpoints/"


def lineage_of(checkpoint: str) -> dict[str, Any]:
    """Parent run and step of a `<run>/checkpoints/step-N` path (None where the path does not say)."""
    checkpoint = checkpoint.rstrip("/")
    parent, found, name = checkpoint.rpartition(CHECKPOINTS)
    number = name.removeprefix("step-")
    return {"parent": parent if found else None, "step": int(number) if number.isdigit() else None,
            "checkpoint": checkpoint}  # fmt: skip


def record_lineage(output_path: str, initialize_from: str | None) -> None:
    """Write `lineage.json` for a fork (nothing for a run that starts from scratch)."""
    if initialize_from is not None:
        storage.write_json_atomic(storage.join(output_path, LINEAGE_FILE), lineage_of(initialize_from))
