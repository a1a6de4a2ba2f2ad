"""Accelerator profiles: what a plan, an MFU figure and an hours estimate need to know about the hardware.

One profile per accelerator a run may be planned on. MFU is model FLOP/s over (per-device peak x devices):
`peak_flops_per_device` is one GPU's or one TPU chip's dense bf16 peak, never a node's, so a run asking for
8 devices is measured against 8 peaks (`mfu_denominator`).

Figures are the vendors' published dense (no sparsity) bf16 peaks, HBM sizes and bandwidths (data sheets:
NVIDIA GB200 NVL72 and H100 SXM, Google Cloud TPU v5p); a link's figure is what one device receives, one way:

| profile | device | bf16 peak | HBM | HBM speed | devices / host | fast domain | fast link | slow link |
|---|---|---|---|---|---|---|---|---|
| `gb200` | B200 (GB200 NVL72) | 2.5 PFLOP/s | 186 GB | 8 TB/s | 4 (a tray) | 72 (NVLink rack) | 900 GB/s | 50 GB/s |
| `h100` | H100 SXM 80 GB | 989 TFLOP/s | 80 GB | 3.35 TB/s | 8 | 8 (NVLink node) | 450 GB/s | 50 GB/s |
| `tpu_v5p` | TPU v5p chip | 459 TFLOP/s | 95 GB | 2.765 TB/s | 4 | 8,960 (ICI pod) | 300 GB/s | 6.25 GB/s |

Fast link: NVLink 5 (1.8 TB/s per GPU both ways), NVLink 4 (900 GB/s both ways), ICI (4,800 Gb/s per chip over all
its links, counted as half each way). Slow link, between fast domains: one 400 Gb/s InfiniBand NIC per GPU
(ConnectX-7), and for TPU slices the data-center network, taken as 200 Gb/s per host (an assumption: Google
publishes no per-chip figure). steps/train/step_time.py turns them into a step-time estimate.

The fast domain bounds expert parallelism: the all-to-all that sends tokens to their experts' devices
stays inside NVLink / ICI (steps/train/parallelism.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from executor import ResourceConfig


@dataclass(frozen=True)
class Hardware:
    """One accelerator type, as planning sees it. Never versioned: hardware does not change what is computed."""

    name: str
    """The profile's key (`--hardware NAME`)."""
    accelerator_type: str
    """What a step asks the cluster for (Ray's accelerator_type)."""
    peak_flops_per_device: float
    """Dense bf16 peak of one device (one GPU or one TPU chip), FLOP/s."""
    memory_bytes_per_device: int
    """Accelerator memory of one device that a run may use."""
    devices_per_host: int
    """Devices one host (one JAX process) drives."""
    fast_domain_devices: int
    """Devices joined by the fast interconnect (NVLink, ICI): the largest expert-parallel group."""
    hbm_bytes_per_s: float
    """Memory bandwidth of one device."""
    fast_link_bytes_per_s: float
    """What one device receives per second, one way, from devices of its own fast domain."""
    slow_link_bytes_per_s: float
    """What one device receives per second, one way, from devices of other fast domains."""
    is_gpu: bool = True
    domain_label: str = "ray.io/gpu-domain"
    """The Ray node label naming each node's fast domain (the cluster config sets it per rack; Ray sets a TPU VM's
    slice name): a gang is placed domain by domain on it (executor/run/gang.py `placement_groups`)."""


HARDWARE = {
    "gb200": Hardware("gb200", "GB200", 2.5e15, 186 * 10**9, 4, 72, 8e12, 900e9, 50e9),
    "h100": Hardware("h100", "H100", 989e12, 80 * 10**9, 8, 8, 3.35e12, 450e9, 50e9),
    "tpu_v5p": Hardware("tpu_v5p", "TPU-V5P", 459e12, 95 * 10**9, 4, 8960, 2.765e12, 300e9, 6.25e9, is_gpu=False,
                        domain_label="ray.io/tpu-slice-name"),
}
"""Every profile, by name."""


def hardware_profile(name: str) -> Hardware:
    """The profile called `name`; a ValueError listing the known ones otherwise."""
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known profiles: {', '.join(sorted(HARDWARE))}")
    return HARDWARE[name]


def mfu_denominator(peak_flops_per_device: float, devices: int) -> float:
    """What a run's model FLOP/s is divided by for MFU: every device's peak, not one device's."""
    if peak_flops_per_device <= 0 or devices <= 0:
        raise ValueError(f"MFU needs a positive peak and device count, got {peak_flops_per_device} x {devices}")
    return peak_flops_per_device * devices


def host_resources(hardware: Hardware, hosts: int, hosts_per_domain: int | None = None) -> ResourceConfig:
    """What a step over `hosts` hosts of `hardware` asks the cluster for: a gang (executor/run/gang.py) reserves one
    placement-group bundle per host; on GPU nodes a host is a node's GPUs (Ray's `GPU`) of the profile's
    accelerator type, on a TPU slice one TPU VM, whose chips Ray counts as `TPU`. With `hosts_per_domain`, the
    gang is placed that many hosts to a fast domain (`domain_label`)."""
    per_host = hardware.devices_per_host
    label = hardware.domain_label if hosts_per_domain else None
    placed = ResourceConfig(hosts=hosts, accelerator_type=hardware.accelerator_type, domain_label=label,
                            hosts_per_domain=hosts_per_domain or None)  # fmt: skip
    if hardware.is_gpu:
        return dataclasses.replace(placed, gpus=per_host)
    return dataclasses.replace(placed, custom={"TPU": per_host})
