"""Fault tests: SIGKILL at random points, ten executor processes at once, a Ray node lost mid-step."""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sharded_steps
from paths import SUPPORT

from executor import Executor, read_status
from executor.dag.records import verify_manifest
from executor.store.events import read_events

RUNNER = str(SUPPORT / "dag_runner.py")
SHARDS = 16
FAST_LEASES = {"EXECUTOR_LEASE_HEARTBEAT_S": "0.2", "EXECUTOR_LEASE_STALE_S": "4.0"}


def start_runner(prefix: Path, counter: Path, sleep_s: float, log: Path) -> subprocess.Popen:
    env = {**os.environ, **FAST_LEASES, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, RUNNER, str(prefix), str(counter), str(SHARDS), str(sleep_s)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip


def reference(tmp_path: Path) -> dict[str, dict[str, str]]:
    steps = sharded_steps.build_dag(shards=SHARDS)
    executor = Executor(str(tmp_path / "reference"))
    executor.run(steps)
    return {step.name: sharded_steps.manifest_digests(executor.output_paths[step]) for step in steps}


def outputs_of(prefix: Path) -> dict[str, str]:
    executor = Executor(str(prefix))
    steps = sharded_steps.build_dag(shards=SHARDS)
    executor.run(steps, dry_run=True)
    return {step.name: executor.output_paths[step] for step in steps}


def count_records(counter: Path) -> tuple[list[dict], int]:
    records = sharded_steps.executions(str(counter))
    return records, len(records)


def committed_shards(prefix: Path) -> int:
    return len(list(prefix.glob("*/.executor_shards/*.json")))


def wait_for_commits(prefix: Path, target: int, process: subprocess.Popen, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and process.poll() is None:
        if committed_shards(prefix) >= target:
            return
        time.sleep(0.01)


@pytest.mark.slow
def test_sigkill_at_random_points_then_rerun_gives_identical_outputs(tmp_path):
    expected = reference(tmp_path)
    prefix, counter, log = tmp_path / "killed", tmp_path / "counter", tmp_path / "runs.log"
    rng = random.Random(20261129)
    kills, completed_runs = 0, 0
    for _ in range(60):
        process = start_runner(prefix, counter, sleep_s=0.5, log=log)
        kind = kills % 3
        if kind < 2:  # a kill at a random moment: start-up, lease waits, planning, shards, commits, status writes
            try:
                process.wait(timeout=rng.uniform(0.1, 1.2) if kind == 0 else rng.uniform(1.2, 2.2))
            except subprocess.TimeoutExpired:
                pass
        else:  # a kill shortly after 1 or 2 more shards committed: mid-shard, mid-commit, or before a marker
            wait_for_commits(prefix, committed_shards(prefix) + rng.randint(1, 2), process)
            time.sleep(rng.uniform(0, 0.5))
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            kills += 1
            continue
        assert process.returncode == 0, log.read_text()[-3000:]
        completed_runs += 1
        break
    assert kills >= 6, f"only {kills} kills landed before the DAG finished; widen the window"
    assert completed_runs == 1
    assert run_to_completion(prefix, counter, log) == 0  # a further rerun is a no-op that succeeds

    outputs = outputs_of(prefix)
    assert {name: sharded_steps.manifest_digests(path) for name, path in outputs.items()} == expected
    for path in outputs.values():
        assert read_status(path) == "SUCCESS" and verify_manifest(path) == []
        assert [event.status for event in read_events(path)].count("SUCCESS") == 1
    records, _ = count_records(counter)
    recomputed = [record for record in records if record["kind"] == "shard" and record["already_done"]]
    assert recomputed == [], f"committed shards ran again: {recomputed}"
    shard_runs = collections.Counter(record["name"] for record in records if record["kind"] == "shard")
    assert len(shard_runs) == 2 * SHARDS
    print(f"kills={kills} shard executions={sum(shard_runs.values())} for {2 * SHARDS} shards")


def run_to_completion(prefix: Path, counter: Path, log: Path) -> int:
    process = start_runner(prefix, counter, sleep_s=0.0, log=log)
    return process.wait(timeout=300)


@pytest.mark.slow
def test_ten_executor_processes_run_every_step_and_shard_once(tmp_path):
    expected = reference(tmp_path)
    prefix, counter, log = tmp_path / "shared", tmp_path / "counter", tmp_path / "runs.log"
    processes = [start_runner(prefix, counter, sleep_s=0.02, log=log) for _ in range(10)]
    codes = [process.wait(timeout=600) for process in processes]
    assert codes == [0] * 10, log.read_text()[-3000:]
    records, _ = count_records(counter)
    runs = collections.Counter((record["kind"], record["name"]) for record in records)
    assert len([key for key in runs if key[0] == "shard"]) == 2 * SHARDS
    assert len([key for key in runs if key[0] == "step"]) == 4
    assert set(runs.values()) == {1}, {key: count for key, count in runs.items() if count > 1}
    outputs = outputs_of(prefix)
    assert {name: sharded_steps.manifest_digests(path) for name, path in outputs.items()} == expected
    for path in outputs.values():
        assert [event.status for event in read_events(path)].count("RUNNING") == 1
