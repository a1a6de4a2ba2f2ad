"""The executor on gs:// (GCS emulator through gcsfs) and s3:// (moto through s3fs), with faults."""

from __future__ import annotations

import os
import uuid

import pytest
import sharded_steps
from conftest import make_step, race
from services import FaultProxy, use_gcs_endpoint

from executor import Executor, read_status, storage
from executor.cli.commands import main as cli_main
from executor.dag.records import verify_manifest
from executor.store.lease import Lease, LeaseSettings


def unique(prefix: str) -> str:
    return f"{prefix}/{uuid.uuid4().hex[:10]}"


def run_sharded_dag(prefix: str, counter_dir: str = "") -> tuple[Executor, list]:
    steps = sharded_steps.build_dag(shards=5, counter_dir=counter_dir, rounds=300)
    executor = Executor(prefix)
    executor.run(steps)
    return executor, steps


def digests(executor: Executor, steps: list) -> dict:
    return {step.name: sharded_steps.manifest_digests(executor.output_paths[step]) for step in steps}


@pytest.mark.gcs
def test_a_sharded_dag_on_gcs_matches_the_local_run(gcs_emulator, tmp_path, capsys):
    prefix = unique(gcs_emulator)
    remote, steps = run_sharded_dag(prefix)
    local, local_steps = run_sharded_dag(str(tmp_path))
    assert digests(remote, steps) == digests(local, local_steps)
    for step in steps:
        output = remote.output_paths[step]
        assert output.startswith(prefix + "/") and read_status(output) == "SUCCESS"
        assert verify_manifest(output) == []
    assert cli_main(["status", prefix]) == 0
    assert "SUCCESS: 4" in capsys.readouterr().out
    again = Executor(prefix)
    again.run(steps)
    assert all(decision.action == "skip" for decision in again.decisions)


@pytest.mark.gcs
def test_a_dag_survives_a_faulty_gcs_connection(gcs_emulator, tmp_path):
    clean, steps = run_sharded_dag(str(tmp_path))
    upstream_port = int(os.environ["EXECUTOR_TEST_GCS_URL"].rsplit(":", 1)[1])
    prefix = unique(gcs_emulator)
    try:
        with FaultProxy(upstream_port, fail_rate=0.15, seed=7) as proxy:
            use_gcs_endpoint(f"http://127.0.0.1:{proxy.port}")
            faulty, faulty_steps = run_sharded_dag(prefix)
            faults = dict(proxy.faults)
    finally:
        use_gcs_endpoint(os.environ["EXECUTOR_TEST_GCS_URL"])
    assert faults["requests"] > 100
    for kind in ("503", "429", "drop_before", "drop_after"):
        assert faults[kind] > 0, faults
    assert digests(faulty, faulty_steps) == digests(clean, steps)
    for step in faulty_steps:
        output = faulty.output_paths[step]
        assert read_status(output) == "SUCCESS"
        assert verify_manifest(output) == []


@pytest.mark.s3
def test_exclusive_create_and_leases_have_one_winner_on_s3(s3_server):
    path = unique(s3_server) + "/lease.json"
    wins = race(12, lambda index: storage.create_exclusive(path, str(index)))
    assert len(wins) == 1 and storage.read_text(path) == str(wins[0])

    output = unique(s3_server)
    holders = race(8, lambda index: Lease(output, f"worker-{index}", LeaseSettings()).try_acquire())
    assert len(holders) == 1
    assert Lease(output, "observer", LeaseSettings()).current()["worker"] == f"worker-{holders[0]}"


@pytest.mark.s3
def test_a_dag_on_s3(s3_server, calls):
    c = make_step("c", make_step("b", make_step("a", text="A"), text="B"), text="C")
    executor = Executor(unique(s3_server))
    executor.run([c])
    assert storage.read_text(executor.output_paths[c] + "/out.txt") == "C+B+A"
    assert read_status(executor.output_paths[c]) == "SUCCESS"
    Executor(executor.prefix).run([c])
    assert calls.counts == {"a": 1, "b": 1, "c": 1}
