"""`metrics.jsonl`: the train step's live figures, one JSON line per Levanter `log` call.

Levanter logs everything a run produces through its tracker protocol: the training loss and learning rate
(`train/loss`, `optim/learning_rate`), gradient and parameter norms (its `WatchCallback`: `grad/norm/total`,
`params/norm/total` and one norm per parameter), throughput (`throughput/tokens_per_second`), and the eval
losses per component as they come (`eval/<name>/loss`). A tracker that appends those lines to a file under
the step's output is therefore all the dashboard needs, and it sits next to wandb (offline) without either
knowing of the other.

Each line is `{"step": s, "time": unix seconds, <metric>: value, ...}`; a value that is not finite is the string
"NaN", "Infinity" or "-Infinity" (executor/store/metrics_log.py), which every view reads back as what it was. To
every line carrying `throughput/tokens_per_second` the tracker adds `model_flops_per_second` from
steps/model/model_size.py (the one FLOPs calculator the ladder and hero plan use, not Levanter's own count) and,
when the accelerator's peak is known, `mfu` = achieved / (per-device peak x devices) (steps/train/hardware.py): the
tokens per second Levanter logs are the whole run's, so one device's peak alone would overstate MFU by the device
count. To every line carrying `train/loss` it adds the tokens of each component trained on so far,
`data/tokens/<component>` (steps/train/data_order.py), which the composition view sums per mixture phase. A resumed
run appends: a step logged twice (before and after a kill) has two lines, the later one is the run that continued.

On a local disk lines are flushed as they are written, so a killed run leaves every line up to the kill.
Under a gs:// or s3:// prefix, where objects cannot be appended to, they go to segments beside the file
(`metrics.jsonl.d/`, executor/store/metrics_log.py) at most `flush_seconds` apart, which readers take as one
stream: the dashboard follows a run on GCS as it goes, and a resumed run adds segments instead of
replacing the file (gcsfs opens "a" as overwrite).

The train step's wandb run (`wandb_config`) names its executor step, and a fork is a wandb fork of its parent's
run:

    wandb_config("moe-train", "gs://b/train/fork-1a2b3c4d", "gs://b/train/hero-5e6f7a8b/checkpoints/step-12000")

The run id is the step's output folder name (`fork-1a2b3c4d`), so it is the same on every attempt and a
resumed step continues its own wandb run. Its config carries `executor/step`, `executor/hash` and
`executor/output_path` (from the `.executor_info` the executor wrote before calling the step), and a fork's
`executor/parent` and `executor/fork_step`. On a fork's first start (no checkpoint of its own yet) wandb's
`fork_from="<parent run id>?_step=N"` is set, so the public project draws the lineage too; a resumed fork
omits it (wandb refuses `fork_from` with `resume`) and resumes its own run. Runs are offline unless
WANDB_MODE says otherwise; `python -m executor wandb-sync <step output path>` uploads them later.

A run also records where it came from, for the run view and the public site: a fork's `lineage.json` (its parent
run and step, `record_lineage`) and the ladder's prediction it is watched against, sealed when it starts
(`seal_prediction`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import wandb
from levanter.tracker.tracker import NoopTracker, Tracker, TrackerConfig
from levanter.tracker.wandb import WandbConfig

from executor import (
    METRICS_FLUSH_SECONDS,
    MetricsLog,
    layout,
    metric_json,
    progress,
    read_events,
    read_metrics_bytes,
    storage,
)
from steps.train.data_order import TokensSeen
from steps.train.hardware import mfu_denominator

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TOKENS_PER_SECOND = "throughput/tokens_per_second"
CHECKPOINTS_SEGMENT = "/checkpoints/"
"""What separates a run's output path from a checkpoint's name in a checkpoint path."""


def lineage_of(checkpoint: str) -> dict[str, Any]:
    """A fork's lineage: the parent run and step of a `<run>/checkpoints/step-N` path it starts from (None where the
    path does not say). The run view (executor/watch/training/panels.py) draws the parent's loss up to that step beside
    the fork's, and the wandb run's config carries the same two figures."""
    checkpoint = checkpoint.rstrip("/")
    parent, found, name = checkpoint.rpartition(CHECKPOINTS_SEGMENT)
    number = name.removeprefix("step-")
    return {"parent": parent if found else None, "step": int(number) if number.isdigit() else None,
            "checkpoint": checkpoint}  # fmt: skip


def record_lineage(output_path: str, initialize_from: str | None) -> None:
    """Write `lineage.json` (`lineage_of`) for a fork; nothing for a run that starts from scratch."""
    if initialize_from is not None:
        storage.write_json_atomic(storage.join(output_path, layout.LINEAGE_FILE), lineage_of(initialize_from))


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
    """The prediction a run is watched against, sealed when it starts (Marin preregistered its hero's loss):
    `<output_path>/prediction_seal.json` (`seal_of`: the prediction's sha256, when it was made, when the run
    sealed it), written once by exclusive create, so a resumed run keeps its first seal. The run view
    (executor/watch/training/run_view.py) shows "predicted at T, before the first step at T2, digest D" and says so
    when prediction.json no longer has that digest."""
    if prediction_path is None:
        return
    seal = seal_of(prediction_path, dt.datetime.now(dt.UTC))
    storage.create_exclusive(storage.join(output_path, layout.PREDICTION_SEAL_FILE), json.dumps(seal, indent=1))


def _plain(value: Any) -> Any:
    """A JSON value for a logged metric: arrays of one element become floats; a float that is not finite is
    written as "NaN", "Infinity" or "-Infinity" (executor.metric_json), so the views mark it and the alerts fire."""
    if isinstance(value, jax.Array | np.ndarray | np.generic):
        array = np.asarray(value)
        value = array.item() if array.size == 1 else array.tolist()
    if isinstance(value, float):
        return metric_json(value)
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return str(value)


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = _plain(value)
    return flat


class ProgressTracker(NoopTracker):
    """Every process's report of each completed training step (a `train/loss` line) to `executor.progress`, which
    a gang's heartbeat carries to the driver: a gang whose members all answer but none advances is hung."""

    def log(self, metrics: Mapping[str, Any], *, step: int | None, commit: bool | None = None) -> None:
        if step is not None and "train/loss" in metrics:
            progress.report(step)


class JsonlMetricsTracker(Tracker):
    """Appends every logged metric dict, with its step, to `<output_path>/metrics.jsonl` (and reports the step's
    progress, as `ProgressTracker` does on the other processes)."""

    name: str = "metrics_jsonl"

    def __init__(
        self,
        path: str,
        flops_per_token: float,
        peak_flops_per_device: float | None,
        devices: int,
        flush_seconds: float = METRICS_FLUSH_SECONDS,
        tokens_seen: TokensSeen | None = None,
    ):
        self._path = path
        self._flops_per_token = flops_per_token
        self._peak = mfu_denominator(peak_flops_per_device, devices) if peak_flops_per_device else None
        self._tokens_seen = tokens_seen
        # A resumed run continues the same stream: appended locally, new segments on gs:// and s3://.
        self._log = MetricsLog(path, flush_seconds=flush_seconds)

    def log_hyperparameters(self, hparams: dict[str, Any]) -> None:
        pass

    def log(self, metrics: Mapping[str, Any], *, step: int | None, commit: bool | None = None) -> None:
        line = _flatten(metrics)
        tokens_per_second = line.get(TOKENS_PER_SECOND)
        if isinstance(tokens_per_second, float | int):
            achieved = tokens_per_second * self._flops_per_token
            line["model_flops_per_second"] = achieved
            if self._peak:
                line["mfu"] = achieved / self._peak
        if self._tokens_seen is not None and step is not None and "train/loss" in line:
            line.update(self._tokens_seen.after_step(step))
        record = {"step": step, "time": time.time(), **line}
        self._log.write(json.dumps(record))
        if step is not None and "train/loss" in line:
            progress.report(step)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        self.log({f"summary/{key}": value for key, value in metrics.items()}, step=None)

    def log_artifact(self, artifact_path: Any, *, name: str | None = None, type: str | None = None) -> None:
        pass

    def finish(self) -> None:
        self._log.close()


@TrackerConfig.register_subclass("metrics_jsonl")
@dataclasses.dataclass
class JsonlMetricsConfig(TrackerConfig):
    """Levanter tracker config for `JsonlMetricsTracker` (process 0 writes; the others only report progress)."""

    output_path: str = ""
    flops_per_token: float = 0.0
    peak_flops_per_device: float | None = None
    """Dense bf16 peak of one device (steps/train/hardware.py); None: no `mfu`."""
    devices: int | None = None
    """Devices the run trains on (None: every device JAX sees, `jax.device_count()`)."""
    flush_seconds: float = METRICS_FLUSH_SECONDS
    """On object stores, how often the lines logged since are made visible (executor/store/metrics_log.py)."""
    tokens_seen: TokensSeen | None = None
    """The run's data order, to log `data/tokens/<component>` with each loss (None: not logged)."""

    def init(self, run_id: str | None) -> Tracker:
        if jax.process_index() != 0:
            return ProgressTracker()
        path = storage.join(self.output_path, METRICS_FILE)
        devices = self.devices if self.devices is not None else jax.device_count()
        return JsonlMetricsTracker(path, self.flops_per_token, self.peak_flops_per_device, devices, self.flush_seconds,
                                   self.tokens_seen)  # fmt: skip


def read_metrics(output_path: str) -> list[dict[str, Any]]:
    """The lines of a train step's metrics.jsonl, in order; a line cut by a kill is skipped."""
    path = storage.join(output_path, METRICS_FILE)
    data = read_metrics_bytes(path)
    if data is None:
        return []
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("skipping a partial line of %s (the run was killed mid-write)", path)
    return records


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
    info: dict[str, Any] = storage.read_json(storage.join(output_path, layout.INFO_FILE)) or {}
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
