"""What one host of a multi-host train or evaluate step asks the cluster for, from its hardware profile.

A gang (executor/gang.py) reserves one placement-group bundle per host. On GPU nodes a host is a node's GPUs
(Ray's `GPU` resource) of the profile's accelerator type; on a TPU slice a host is one TPU VM, whose chips
Ray counts as the `TPU` resource. The placement group spreads the bundles one per node.
"""

from __future__ import annotations

from executor import ResourceConfig
from steps.train.hardware import Hardware


def host_resources(hardware: Hardware, hosts: int) -> ResourceConfig:
    """The resources of a step over `hosts` hosts of `hardware`, each driving all of its host's devices."""
    per_host = hardware.devices_per_host
    if hardware.is_gpu:
        return ResourceConfig(hosts=hosts, gpus=per_host, accelerator_type=hardware.accelerator_type)
    return ResourceConfig(hosts=hosts, custom={"TPU": per_host}, accelerator_type=hardware.accelerator_type)
