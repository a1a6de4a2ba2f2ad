"""A gang placed rack by rack on a Ray cluster of four raylets on this machine, two racks of two nodes labelled
`rack=a` and `rack=b` and added interleaved (a, b, a, b): ranks 0-1 share one rack and ranks 2-3 the other, so an
expert group of two consecutive ranks never spans racks, and the gang still computes its global sum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ray_cluster_on_this_machine
from gang_steps import GlobalSumConfig, global_sum

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, ResourceConfig
from executor.run.collector import YOUNG_THRESHOLD
from executor.run.gang import placement_groups
from executor.store.layout import GANG_FILE

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RACKED = ResourceConfig(hosts=4, cpus=0.25, custom={"host": 1}, cpu_devices_per_host=1, domain_label="rack",
                        hosts_per_domain=2, hang_timeout_s=60.0)  # fmt: skip


@pytest.fixture
def two_racks(monkeypatch):
    with ray_cluster_on_this_machine(monkeypatch) as cluster:
        for rack in ("a", "b", "a", "b"):  # interleaved: node order alone would alternate the racks rank by rank
            cluster.add_node(num_cpus=1, resources={"host": 1}, labels={"rack": rack})
        yield cluster


def test_rack_placement_asks_one_group_per_domain_packed_into_it():
    groups = placement_groups(RACKED)
    assert [len(group["bundles"]) for group in groups] == [2, 2]
    assert all(group["topology_strategy"] == {"ray.io/node-id": "PACK", "rack": "STRICT_PACK"} for group in groups)
    unplaced = placement_groups(ResourceConfig(hosts=4, cpu_devices_per_host=1))
    assert len(unplaced) == 1 and unplaced[0]["strategy"] == "PACK"


def test_rack_placed_gang_keeps_consecutive_ranks_in_one_rack(tmp_path, two_racks):
    step = ExecutorStep(name="gang/racks", fn=global_sum, config=GlobalSumConfig(THIS_OUTPUT_PATH), resources=RACKED)
    executor = Executor(str(tmp_path), backend="ray", shared_filesystem=True)
    executor.run([step])
    output_path = Path(executor.output_paths[step])
    assert json.loads((output_path / "seen.json").read_text()) == {"sum": 60.0, "devices": 4, "processes": 4,
                                                                 "gc_young": YOUNG_THRESHOLD}
    gang = json.loads((output_path / GANG_FILE).read_text())
    racks = [member["domain"] for member in gang["members"]]
    nodes = [member["node_id"] for member in gang["members"]]
    assert racks[0] == racks[1] and racks[2] == racks[3] and racks[0] != racks[2], racks
    assert len(set(nodes)) == 4, nodes  # one host a node
    assert gang["placement"] == "2 x 2 hosts, PACK within one rack"
