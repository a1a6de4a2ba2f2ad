"""Small real sharded steps for the fault tests, importable by spawned processes and Ray workers.

`make_parts` writes one file per shard (a deterministic hash chain of the shard id, so outputs
can be compared byte for byte); `sum_parts` reads them back and writes a total. Every shard
execution leaves a record in `counter_dir`, outside any step output, saying whether the
shard's marker already existed when it started: a committed shard must never run again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
import uuid
from dataclasses import dataclass

import fsspec

from executor import THIS_OUTPUT_PATH, ExecutorStep, output_path_of, storage, versioned
from executor.shards.runner import run_sharded
from executor.shards.writer import Shard, ShardWriter, marker_path


@dataclass(frozen=True)
class PartsConfig:
    output_path: str
    shards: int
    """How many shards (versioned)."""
    rounds: int = 2000
    """Hash rounds per shard: the work a shard does (versioned)."""
    counter_dir: str = ""
    """Where executions are recorded (plain: not part of the identity)."""
    parallelism: str = "thread"
    shard_sleep_s: float = 0.0
    """Extra time per shard, to widen the window for kills (plain)."""


@dataclass(frozen=True)
class ShardJob:
    output_path: str
    shard_id: str
    rounds: int
    counter_dir: str
    sleep_s: float


def record_execution(counter_dir: str, kind: str, name: str, already_done: bool) -> None:
    if not counter_dir:
        return
    os.makedirs(counter_dir, exist_ok=True)
    record = {"kind": kind, "name": name, "already_done": already_done, "pid": os.getpid(), "time": time.time()}
    file_name = f"{kind}-{name.replace('/', '_').replace(':', '_')}-{uuid.uuid4().hex}.json"
    temp = os.path.join(counter_dir, f".{file_name}.tmp")
    with open(temp, "w") as handle:
        json.dump(record, handle)
    os.replace(temp, os.path.join(counter_dir, file_name))  # a reader (or a kill) never sees half a record


def make_part(job: ShardJob, out: ShardWriter) -> dict:
    already = storage.exists(marker_path(job.output_path, job.shard_id))
    record_execution(job.counter_dir, "shard", f"{storage.basename(job.output_path)}:{job.shard_id}", already)
    digest = job.shard_id.encode()
    lines = []
    for index in range(job.rounds):
        digest = hashlib.sha256(digest).digest()
        if index % 100 == 0:
            lines.append(digest.hex())
    if job.sleep_s:
        time.sleep(job.sleep_s)
    with out.open(f"parts/{job.shard_id}.txt") as handle:
        handle.write(("\n".join(lines) + "\n").encode())
    return {"rows": len(lines)}


def make_parts(config: PartsConfig) -> None:
    record_execution(config.counter_dir, "step", storage.basename(config.output_path), False)
    shards = [
        Shard(f"{index:04d}", ShardJob(config.output_path, f"{index:04d}", config.rounds, config.counter_dir,
                                       config.shard_sleep_s))
        for index in range(config.shards)
    ]  # fmt: skip
    run_sharded(config.output_path, shards, make_part, parallelism=config.parallelism, max_workers=2)


@dataclass(frozen=True)
class SumConfig:
    input_path: str
    output_path: str
    counter_dir: str = ""


def sum_parts(config: SumConfig) -> None:
    record_execution(config.counter_dir, "step", storage.basename(config.output_path), False)
    fs, root = fsspec.core.url_to_fs(config.input_path)
    names = sorted(fs.ls(root + "/parts", detail=False))
    total = hashlib.sha256()
    lines = 0
    for name in names:
        data = fs.cat_file(name)
        total.update(data)
        lines += data.count(b"\n")
    with fsspec.open(f"{config.output_path}/total.json", "w", auto_mkdir=True) as handle:
        json.dump({"files": len(names), "lines": lines, "sha256": total.hexdigest()}, handle)


def build_dag(shards: int = 12, counter_dir: str = "", parallelism: str = "thread", sleep_s: float = 0.0,
              rounds: int = 2000) -> list[ExecutorStep]:  # fmt: skip
    """parts_a and parts_b (sharded) -> total (reads both)."""
    parts = [
        ExecutorStep(
            name=f"parts_{label}",
            fn=make_parts,
            config=PartsConfig(
                THIS_OUTPUT_PATH, versioned(shards), versioned(rounds + offset), counter_dir, parallelism, sleep_s
            ),
        )
        for label, offset in (("a", 0), ("b", 1))
    ]
    totals = [
        ExecutorStep(f"total_{p.name[-1]}", sum_parts, SumConfig(output_path_of(p), THIS_OUTPUT_PATH, counter_dir))
        for p in parts
    ]
    return parts + totals


def executions(counter_dir: str) -> list[dict]:
    if not os.path.isdir(counter_dir):
        return []
    records = []
    for name in os.listdir(counter_dir):
        if name.startswith("."):
            continue
        with open(os.path.join(counter_dir, name)) as handle:
            records.append(json.load(handle))
    return records


def manifest_digests(output_path: str) -> dict[str, str]:
    manifest = storage.read_json(storage.join(output_path, ".executor_manifest"))
    assert manifest is not None, f"{output_path} has no manifest"
    return {entry["path"]: entry["sha256"] for entry in manifest["files"]}


def timed_shard(sleep_s: float, out: ShardWriter) -> dict:
    """Sleeps; its marker's stats say when it ran (to tell shards that ran at once from shards that took turns)."""
    start = time.time()
    time.sleep(sleep_s)
    return {"start": start, "end": time.time()}


def ran_at_once(output_path: str, sleep_s: float = 0.6, memory_bytes: int | None = None, **options) -> bool:
    """Runs three `timed_shard`s; whether any two of them overlapped in time."""
    shards = [Shard(f"s{index}", sleep_s) for index in range(3)]
    report = run_sharded(output_path, shards, timed_shard, memory_bytes=memory_bytes, **options)
    spans = sorted((marker["stats"]["start"], marker["stats"]["end"]) for marker in report.markers.values())
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))
