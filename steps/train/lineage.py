"""Where a run came from: a fork's lineage (which run, and which of its checkpoints, it started from) and the
prediction it is watched against, sealed when it starts.

    record_lineage(output_path, "gs://b/train/hero-1a2b3c4d/checkpoints/step-12000")
    # <output_path>/lineage.json: {"parent": "gs://b/train/hero-1a2b3c4d", "step": 12000, "checkpoint": ...}

The run view (executor/dashboard/panels.py) reads it to draw the parent's loss up to that step beside the
fork's; wandb's offline run carries the same two figures in its config.

    seal_prediction("gs://b/train/hero-1a2b3c4d", "gs://b/scaling/ladder-5e6f7a8b")
    # <run>/prediction_seal.json: {"prediction": ".../prediction.json", "sha256": "…", "predicted_at": "…",
    #                              "sealed_at": "…"}

The seal is written once, before the first training step, by exclusive create: a resumed run keeps its first
seal (Marin preregistered its hero's loss). The run view (executor/dashboard/run_view.py) shows "predicted at T,
before the first step at T2, digest D" and says so when prediction.json no longer has that digest.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

from executor import storage
from executor.status import LINEAGE_FILE, PREDICTION_SEAL_FILE, read_events

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


PREDICTION_FILE = "prediction.json"


def seal_of(prediction_path: str, now: dt.datetime) -> dict[str, Any]:
    """The seal of the scaling step's prediction: its digest, when the scaling step wrote it, and now."""
    path = storage.join(prediction_path, PREDICTION_FILE)
    data = storage.read_bytes(path)
    if data is None:
        raise ValueError(f"prediction_path {prediction_path} has no {PREDICTION_FILE}: run its scaling step first")
    finished = [event.time for event in read_events(prediction_path) if str(event.status) == "SUCCESS"]
    return {"prediction": path, "sha256": hashlib.sha256(data).hexdigest(),
            "predicted_at": finished[0] if finished else None, "sealed_at": now.isoformat()}  # fmt: skip


def seal_prediction(output_path: str, prediction_path: str | None) -> None:
    """Seal the prediction into `<output_path>/prediction_seal.json` unless a first attempt already did."""
    if prediction_path is None:
        return
    seal = seal_of(prediction_path, dt.datetime.now(dt.UTC))
    storage.create_exclusive(storage.join(output_path, PREDICTION_SEAL_FILE), json.dumps(seal, indent=1))
