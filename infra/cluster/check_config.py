"""Check a Ray cluster config offline: schema, node kinds, and which node types steps scale up.

    .venv/bin/python infra/cluster/check_config.py [infra/cluster/gcp.yaml ...]   # one or more configs

1. Ray's own launcher checks (`prepare_config` fills in defaults, `validate_config` applies
   ray-schema.json), the same ones `ray up` runs before it contacts the cloud.
2. For GCP, which node configs Ray's provider treats as Compute VMs and which as TPU VMs (needs
   google-api-python-client, which the image has; skipped with a note when it is missing).
3. For typical steps, the node types Ray's autoscaler would launch: each `ResourceConfig` goes
   through the Ray backend's own mapping (`executor.run.backends.ray_options`) and then through the
   autoscaler's bin-packing (`get_nodes_for`), so the check covers the contract between the config
   and the code that uses it. Exits 1 when a step would land on the wrong node type.

4. For the hero's configs (`gcp_gpu_hero.yaml`, `gcp_tpu_hero.yaml`), the multi-host train steps of the full
   plan (`experiments/hero_535b.py`'s FULL_DEVICES): a gang's bundles (`executor.run.gang.bundle_specs`, one per
   host) must make the autoscaler start exactly one GPU node per host; on TPU, whose slices are fixed, they
   must fit one slice's hosts, one bundle per host (STRICT_SPREAD).

Nothing here contacts a cloud. Steps 1 and 3 use Ray internals (`ray.autoscaler._private`), which
may move between Ray versions; the project pins Ray.
"""

from __future__ import annotations

import copy
import functools
import logging
import sys
from pathlib import Path
from typing import Any

import yaml
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer, get_nodes_for
from ray.autoscaler._private.util import prepare_config, validate_config

from executor.dag.spec import ResourceConfig
from executor.run.backends import ray_options
from executor.run.gang import bundle_specs
from experiments.hero_535b import FULL_DEVICES
from steps.train.hardware import HARDWARE, host_resources

CPU_TYPES = {"cpu_spot", "cpu_highmem_spot"}

# (what the step is, how many tasks, its resources, the node types it may scale up; empty: none)
EXPECTED: list[tuple[str, int, ResourceConfig, set[str]]] = [
    ("data shard", 1, ResourceConfig(cpus=1), {"cpu_spot"}),
    ("10,000 data shards", 10_000, ResourceConfig(cpus=1), CPU_TYPES),
    ("data step, 32 GiB", 1, ResourceConfig(cpus=4, memory_gb=32), {"cpu_spot"}),
    ("data step, 150 GiB", 1, ResourceConfig(cpus=8, memory_gb=150), {"cpu_highmem_spot"}),
    ("H100 step", 1, ResourceConfig(cpus=0, gpus=8, accelerator_type="H100"), {"gpu_h100"}),
    ("H100 step, per-chip resource", 1, ResourceConfig(cpus=0, gpus=8, custom={"accelerator:H100": 8}), {"gpu_h100"}),
    ("TPU v5p-8 step", 1, ResourceConfig(cpus=0, accelerator_type="v5p-8", custom={"TPU": 4}), {"tpu_v5p_8"}),
    ("H100 step, cpus left at the default (0)", 1, ResourceConfig(gpus=8, accelerator_type="H100"), {"gpu_h100"}),
    ("H100 step asking cpus=1 (finds no node)", 1, ResourceConfig(cpus=1, gpus=8, accelerator_type="H100"), set()),
]


DATA_STEPS = EXPECTED[:3]


def gang_steps(hardware: str) -> list[tuple[str, ResourceConfig]]:
    """The full plan's multi-host train steps on `hardware`: a ladder rung's and the hero's."""
    profile = HARDWARE[hardware]
    rung, hero = (devices // profile.devices_per_host for devices in FULL_DEVICES[hardware])
    return [(f"rung train step, {rung} hosts", host_resources(profile, rung)),
            (f"hero train step, {hero} hosts", host_resources(profile, hero))]  # fmt: skip


# Per config file: the single-task steps above that apply, the gangs the autoscaler must grow nodes for,
# and the gangs that must fit a fixed multi-host slice.
CHECKS: dict[str, tuple[list, list, list]] = {
    "gcp.yaml": (EXPECTED, [], []),
    "gcp_gpu_hero.yaml": (DATA_STEPS, gang_steps("gb200"), []),
    "gcp_tpu_hero.yaml": (DATA_STEPS, [], gang_steps("tpu_v5p")),
}


def task_demand(resources: ResourceConfig) -> dict[str, float]:
    """The resource bundle Ray schedules for a step task with these resources."""
    options = ray_options(resources, max_attempts=1)
    bundle = {
        "CPU": options["num_cpus"],
        "GPU": options["num_gpus"],
        "memory": options.get("memory", 0),
        **options.get("resources", {}),
    }
    if "accelerator_type" in options:
        bundle[f"accelerator_type:{options['accelerator_type']}"] = 0.001  # what Ray itself adds
    return {name: amount for name, amount in bundle.items() if amount}


def node_kinds(config: dict[str, Any]) -> dict[str, str] | str:
    """COMPUTE or TPU per node type, as Ray's GCP provider sees it; a note when it cannot tell."""
    if config["provider"]["type"] != "gcp":
        return "not a GCP config"
    try:
        from ray.autoscaler._private.gcp.config import get_node_type
    except ImportError as error:
        return f"skipped ({error.name} is not installed; `pip install google-api-python-client`)"
    return {name: get_node_type(node["node_config"]).name for name, node in config["available_node_types"].items()}


def scale_up(config: dict[str, Any], demands: list[dict[str, Any]]) -> tuple[dict[str, int], int]:
    """Node types (and counts) the autoscaler adds for these demands, and how many stay unplaced."""
    scorer = functools.partial(_default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({}))
    to_add, unplaced = get_nodes_for(
        config["available_node_types"], {}, config["head_node_type"], config["max_workers"], demands, scorer
    )
    return dict(to_add), len(unplaced)


def slice_hosts(node_config: dict[str, Any]) -> int:
    """Hosts of a TPU v5p slice (`v5p-N` counts TensorCores: N / 2 chips, 4 chips a host); 0 if not one."""
    accelerator = str(node_config.get("acceleratorType", ""))
    return int(accelerator.removeprefix("v5p-")) // 2 // 4 if accelerator.startswith("v5p-") else 0


def fits_a_slice(config: dict[str, Any], bundles: list[dict[str, float]]) -> str | None:
    """The TPU node type one of whose slices takes every bundle on a host of its own; None if none does."""
    for name, node in config["available_node_types"].items():
        host = node.get("resources", {})
        if slice_hosts(node["node_config"]) >= len(bundles) and all(
            all(host.get(resource, 0) >= amount for resource, amount in bundle.items()) for bundle in bundles
        ):
            return str(name)
    return None


def check_gangs(config: dict[str, Any], grown: list, fixed: list) -> int:
    """Print and count the gangs that would not get one host per member (see the module doc)."""
    wrong = 0
    for label, resources in grown:
        launched, unplaced = scale_up(config, bundle_specs(resources))
        ok = len(launched) == 1 and sum(launched.values()) == resources.hosts and not unplaced
        wrong += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label:42s} -> {launched or 'no node type fits'}")
    for label, resources in fixed:
        node_type = fits_a_slice(config, bundle_specs(resources))
        wrong += node_type is None
        print(f"{'ok  ' if node_type else 'FAIL'} {label:42s} -> one {node_type or 'slice: none fits'}")
    return wrong


def main(path: str) -> int:
    # The autoscaler logs every demand it cannot place (thousands of shards waiting for capacity): noise here.
    logging.getLogger("ray.autoscaler._private.resource_demand_scheduler").setLevel(logging.ERROR)
    config = prepare_config(copy.deepcopy(yaml.safe_load(Path(path).read_text())))
    validate_config(config)
    print(f"{path}: valid for Ray's cluster launcher (schema and defaults)")
    kinds = node_kinds(config)
    print(f"node kinds: {kinds}")

    single, grown, fixed = CHECKS.get(Path(path).name, (EXPECTED, [], []))
    wrong = check_gangs(config, grown, fixed)
    for label, count, resources, allowed in single:
        launched, unplaced = scale_up(config, [task_demand(resources)] * count)
        ok = set(launched) <= allowed and (bool(launched) or not allowed)
        wrong += not ok
        note = f", {unplaced} wait for capacity" if unplaced and launched else ""
        print(f"{'ok  ' if ok else 'FAIL'} {label:42s} -> {launched or 'no node type fits'}{note}")
    if wrong:
        print(f"{wrong} step kind(s) would scale up the wrong node type", file=sys.stderr)
    return 1 if wrong else 0


def main_all(paths: list[str]) -> int:
    """Check each config in turn (one process: the imports are most of a check's time); 1 if any failed."""
    failed = 0
    for path in paths:
        print(f"== {path}", flush=True)
        failed |= main(path)
    return failed


if __name__ == "__main__":
    sys.exit(main_all(sys.argv[1:] or ["infra/cluster/gcp.yaml"]))
