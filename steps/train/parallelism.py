"""A train or evaluate step's parallelism plan and its memory per device, worked out before anything runs.

The layout (nothing here is versioned: it changes where numbers live and what is kept or recomputed, never which
numbers are computed):

- **mesh** `{"data": D, "expert": E}` over `devices = D x E`, or `{"domain": R, "data": D, "expert": E}` when the
  run spans R whole fast domains (racks; `domain` outermost, data parallel across them, `expert` inside one: the
  layout is the same as `{"data": R x D, "expert": E}`'s). Every device holds distinct tokens (the batch
  splits over all of them); every weight, its gradient and its AdamW moments are sharded over the whole mesh
  (dense weights over data x expert; routed experts split over `expert`, E groups of `n_experts / E`, and
  FSDP-sharded over `data` within a group) and gathered a layer at a time for compute. The all-to-all that sends
  a token to its experts' devices stays inside one fast domain. steps/model/levanter_config.py's `trainer_mesh`
  builds this layout in Levanter's trainer.
- **precision**: f32 master weights, gradients and AdamW moments, bf16 compute (`compute_bytes` = 2; the CPU
  calibration runs f32, 4).
- **remat** (steps/model/moe_layers.py): "none", "layer" or "period"; and the **microbatch**, sequences per device
  per forward/backward pass. The plan takes the largest microbatch that fits, keeping everything (remat "none")
  where that fits, else recomputing per layer or per period, whichever holds less. Both are handed to the step
  (`TrainConfig.remat`, `per_device_parallelism`), which builds exactly what was priced.
- **capacity**: the expert capacity the model trains and evaluates with (the hero's 1.15), which sizes the
  routed copies and the all-to-all's slot grids.

An evaluate step is planned on its own eval batch (forward only, no gradients or moments). steps/train/
memory_model.py prices each term; benchmarks/bench_plan_memory.py holds the total against XLA's
`compiled.memory_analysis()` of the real train step on scaled-down shapes (docs/training.md shows the
table). `plan_parallelism` keeps `HEADROOM` of the device's memory free for XLA's own buffers and fragmentation
and says whether the rest holds the plan (`fits`); `refuse_unless_fits` refuses one that does not, with the
numbers and the smallest change that fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from executor import ConfigError
from steps.model.model_size import MoeShape, uneven_splits
from steps.train.hardware import Hardware, hardware_profile
from steps.train.memory_model import MemoryEstimate, memory_per_device

if TYPE_CHECKING:
    import jmp

HEADROOM = 0.1
"""Share of a device's memory a plan leaves free (XLA's scratch, fragmentation, the runtime)."""
MAX_EXPERT_PARALLEL = 64
"""The widest expert-parallel group planned by default: the hero's published EP64."""
REMAT_CHOICES = ("layer", "period")
"""What the plan recomputes when keeping everything does not fit: the two cost the same recompute (one forward)."""

@dataclass(frozen=True)
class ParallelismPlan:
    """Where a run's devices, tokens and weights go, what it recomputes, and whether it fits. Plain: never versioned."""

    hardware: str
    hosts: int
    devices: int
    mesh: dict[str, int]
    """Axis name -> size; the sizes multiply to `devices`."""
    batch_size: int
    """Sequences per step (train) or per eval batch (evaluate), over all devices."""
    microbatch: int
    """Sequences per device per forward/backward pass (Levanter's `per_device_parallelism`)."""
    remat: str
    """What the backward pass recomputes (steps/model/config.py `REMAT_POLICIES`); "none" for an evaluation."""
    capacity_factor: float | None
    """The expert capacity priced (None: dropless)."""
    memory: MemoryEstimate
    memory_limit_bytes: int
    """What the plan may use of one device: its memory less `HEADROOM`."""
    fits: bool
    training: bool = True
    optimizer: str = "adamw"
    """The optimizer whose state is priced (steps/train/optimizer.py)."""
    notes: list[str] = field(default_factory=list)
    uneven: tuple[str, ...] = ()
    """Dimensions the mesh would split unevenly (`model_size.uneven_splits`): such a plan cannot be laid out,
    whatever its memory, and is refused like one that does not fit."""

    def as_json(self) -> dict:
        return {
            "hardware": self.hardware,
            "hosts": self.hosts,
            "devices": self.devices,
            "mesh": dict(self.mesh),
            "batch_size": self.batch_size,
            "microbatch": self.microbatch,
            "remat": self.remat,
            "capacity_factor": self.capacity_factor,
            **({"optimizer": self.optimizer} if self.training else {}),
            "memory_per_device_bytes": self.memory.as_json(),
            "memory_limit_bytes": self.memory_limit_bytes,
            "fits": self.fits,
            "buildable": not self.uneven,
            **({"uneven": list(self.uneven)} if self.uneven else {}),
        }


COMPUTE_DTYPES = ("float32", "bfloat16")


def precision_policy(compute_dtype: str) -> jmp.Policy:
    """Levanter's mixed-precision policy: f32 master weights (so f32 gradients and AdamW moments), computed in
    `compute_dtype` (jmp casts the parameters inside the loss), the router state kept in f32 (its counts)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}")
    import jmp  # here, not above: it loads JAX, and a plan needs none of it

    from steps.model.router_balance import RouterStatePolicy

    policy = jmp.get_policy(f"p=f32,c={compute_dtype}")
    return RouterStatePolicy(policy.param_dtype, policy.compute_dtype, policy.output_dtype)


class PlanDoesNotFitError(ConfigError):
    """A plan needs more memory per device than the hardware has: refused before any step runs (a ConfigError, so
    a command line reports it in one line, not a traceback)."""


def expert_parallel_size(shape: MoeShape, devices: int, hardware: Hardware) -> int:
    """The largest E dividing both the experts and the devices, within one fast domain and `MAX_EXPERT_PARALLEL`."""
    limit = min(devices, hardware.fast_domain_devices, MAX_EXPERT_PARALLEL, shape.n_experts)
    return max(size for size in range(1, limit + 1) if shape.n_experts % size == 0 and devices % size == 0)


def devices_per_domain(devices: int, experts: int, hardware: Hardware) -> int:
    """Devices of a run in each fast domain it uses: whole expert groups (E consecutive devices) fill a domain, so
    the expert axis stays inside one and the data axis runs across domains (the hero: 64 of each NVL72 rack)."""
    return min(devices, hardware.fast_domain_devices // experts * experts)


def device_mesh(devices: int, experts: int, hardware: Hardware) -> dict[str, int]:
    """`{"data": D, "expert": E}` within one fast domain; over several whole ones `{"domain": R, "data": D, "expert":
    E}`, `domain` the outermost axis (each domain a block of consecutive devices, `expert` inside it). A run that
    fills its last domain only in part keeps one `data` axis, which then crosses domains."""
    per_domain = devices_per_domain(devices, experts, hardware)
    domains = devices // per_domain
    if domains > 1 and devices % per_domain == 0:
        return {"domain": domains, "data": per_domain // experts, "expert": experts}
    return {"data": devices // experts, "expert": experts}


def plan_parallelism(
    shape: MoeShape,
    batch_size: int,
    hardware: Hardware,
    devices: int,
    *,
    training: bool = True,
    microbatch: int | None = None,
    remat: str | None = None,
    capacity_factor: float | None = None,
    optimizer: str = "adamw",
) -> ParallelismPlan:
    """The default plan for `devices` of `hardware`: the largest microbatch that fits, with no remat where that fits,
    else the cheaper of per-layer and per-period remat (module docstring); `microbatch` and `remat` pin either."""
    if devices % hardware.devices_per_host:
        raise ValueError(f"{devices} devices are not whole hosts of {hardware.devices_per_host} {hardware.name}s")
    if batch_size % devices:
        raise ValueError(f"a batch of {batch_size} sequences does not split over {devices} devices")
    experts = expert_parallel_size(shape, devices, hardware)
    mesh = device_mesh(devices, experts, hardware)
    limit = int(hardware.memory_bytes_per_device * (1 - HEADROOM))
    per_device = batch_size // devices
    sizes = [microbatch] if microbatch else [m for m in range(per_device, 0, -1) if per_device % m == 0]
    policies = [remat] if remat else ["none"] if not training else ["none", *REMAT_CHOICES]

    def priced(size: int, policy: str) -> MemoryEstimate:
        return memory_per_device(
            shape, mesh, size, training=training, remat=policy, capacity_factor=capacity_factor,
            microbatches=per_device // size, optimizer=optimizer,  # every profile's attention is flash: no scores kept
        )  # fmt: skip

    choice = _first_fit(sizes, policies, priced, limit)
    size, policy = choice if choice is not None else (sizes[-1], _least(policies, lambda p: priced(sizes[-1], p)))
    memory = priced(size, policy)
    return ParallelismPlan(
        hardware=hardware.name,
        hosts=devices // hardware.devices_per_host,
        devices=devices,
        mesh=mesh,
        batch_size=batch_size,
        microbatch=size,
        remat=policy,
        capacity_factor=capacity_factor,
        memory=memory,
        memory_limit_bytes=limit,
        fits=memory.total <= limit,
        training=training,
        optimizer=optimizer,
        uneven=tuple(uneven_splits(shape, mesh)),
    )


def _first_fit(sizes: list[int], policies: list[str], priced, limit: int) -> tuple[int, str] | None:
    """The largest microbatch that fits and, for it, no remat if that fits, else the remat that holds least."""
    for size in sizes:
        fitting = [policy for policy in policies if priced(size, policy).total <= limit]
        if fitting:
            return size, "none" if "none" in fitting else _least(fitting, lambda p, size=size: priced(size, p))
    return None


def _least(policies: list[str], priced) -> str:
    return min(policies, key=lambda policy: priced(policy).total)


def refuse_unless_fits(step: str, plan: ParallelismPlan, shape: MoeShape | None = None) -> None:
    """Raise PlanDoesNotFitError naming `step`, the numbers (which term, how much over) and the smallest change that
    fits, when `plan` does not fit (or its mesh cannot be laid out: it splits a dimension unevenly). With `shape`, the
    advice names the fewest devices of the same hardware that would hold it."""
    if plan.uneven:
        raise PlanDoesNotFitError(
            f"{step}: the mesh {plan.mesh} on {plan.devices} {plan.hardware} devices splits {', '.join(plan.uneven)} "
            "unevenly, which JAX cannot lay out; use a device count whose data axis (devices / expert) divides them"
        )
    if plan.fits:
        return
    memory = plan.memory
    over = memory.total - plan.memory_limit_bytes
    largest = memory.largest()
    terms = ", ".join(f"{name} {size / 1e9:,.1f}" for name, size in memory.parts().items())
    raise PlanDoesNotFitError(
        f"{step}: needs {memory.total / 1e9:,.1f} GB per device on {plan.devices} {plan.hardware} devices "
        f"(mesh {plan.mesh}, microbatch {plan.microbatch}, remat {plan.remat}) but may use "
        f"{plan.memory_limit_bytes / 1e9:,.1f} GB: {over / 1e9:,.1f} GB over; the largest term is {largest} "
        f"({getattr(memory, largest) / 1e9:,.1f} GB; GB per term: {terms}). {_advice(plan, shape)}"
    )


def _advice(plan: ParallelismPlan, shape: MoeShape | None) -> str:
    """The smallest change that fits: the plan already took the smallest microbatch and the leanest remat, so what
    is left is more devices (every term but the activations shards over them) or a device with more memory."""
    if shape is None:
        return "Use a smaller microbatch, remat, more devices or hardware with more memory."
    hardware = hardware_profile(plan.hardware)
    unpinned = plan_parallelism(shape, plan.batch_size, hardware, plan.devices, training=plan.training,
                                capacity_factor=plan.capacity_factor, optimizer=plan.optimizer)  # fmt: skip
    if unpinned.fits:
        return (f"The smallest change that fits: microbatch {unpinned.microbatch} with remat {unpinned.remat} "
                f"({unpinned.memory.total / 1e9:,.1f} GB per device).")  # fmt: skip
    tried = f"Microbatch {unpinned.microbatch} with remat {unpinned.remat} is the leanest layout on these devices"
    for hosts in range(plan.hosts + 1, 64 * plan.hosts + 1):
        devices = hosts * hardware.devices_per_host
        if plan.batch_size % devices:
            continue
        bigger = plan_parallelism(shape, plan.batch_size, hardware, devices, training=plan.training,
                                  capacity_factor=plan.capacity_factor, optimizer=plan.optimizer)  # fmt: skip
        if bigger.fits and not bigger.uneven:
            return (
                f"{tried}; the smallest change that fits is {devices} devices ({hosts} hosts, mesh {bigger.mesh}, "
                f"microbatch {bigger.microbatch}, remat {bigger.remat}, {bigger.memory.total / 1e9:,.1f} GB per "
                "device), or hardware with more memory."
            )
    return f"{tried}; no device count up to 64x the hosts fits a batch of {plan.batch_size}: use a bigger device."
