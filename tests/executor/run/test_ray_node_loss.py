"""Kill the Ray node that runs a step, mid-step: Ray retries the task elsewhere and the step completes."""

from __future__ import annotations

import json
import os
import threading

import pytest
from conftest import ray_cluster_on_this_machine, wait_until
from node_steps import GateConfig, wait_for_gate

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, ResourceConfig, read_status
from executor.store.events import read_events

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def two_node_cluster(monkeypatch):
    with ray_cluster_on_this_machine(monkeypatch) as cluster:
        yield cluster


def test_losing_the_node_mid_step_is_survived_by_retry(tmp_path, two_node_cluster, monkeypatch):
    monkeypatch.setenv("EXECUTOR_LEASE_HEARTBEAT_S", "0.2")
    monkeypatch.setenv("EXECUTOR_LEASE_STALE_S", "4.0")
    first_node = two_node_cluster.add_node(num_cpus=1, resources={"step_node": 1})
    gate, records = tmp_path / "gate", tmp_path / "records"
    step = ExecutorStep(
        "on_a_doomed_node", wait_for_gate, GateConfig(THIS_OUTPUT_PATH, str(gate), str(records)),
        resources=ResourceConfig(cpus=1, custom={"step_node": 1}),
    )  # fmt: skip
    # Every node of this cluster runs on this machine, so they all see the local prefix.
    executor = Executor(str(tmp_path / "out"), backend="ray", shared_filesystem=True)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            executor.run([step])
        except BaseException as error:  # asserted below
            errors.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    wait_until(lambda: records.exists() and len(os.listdir(records)) == 1, "the step to start on the first node")
    two_node_cluster.add_node(num_cpus=1, resources={"step_node": 1})
    two_node_cluster.remove_node(first_node)  # its raylet and workers die: the step's task is lost
    gate.write_text("")
    runner.join(timeout=300)
    assert not runner.is_alive() and errors == []
    output = executor.output_paths[step]
    assert read_status(output) == "SUCCESS"
    nodes = [json.loads((records / name).read_text())["node"] for name in sorted(os.listdir(records))]
    assert len(set(nodes)) == 2, nodes  # the second attempt ran on the new node
    history = [(event.status, event.attempt) for event in read_events(output)]
    assert ("RUNNING", 1) in history and ("RUNNING", 2) in history and history[-1] == ("SUCCESS", 2)
