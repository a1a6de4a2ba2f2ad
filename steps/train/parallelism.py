"""A train or evaluate step's parallelism plan and its memory per device, worked out before anything runs.

The layout (nothing here is versioned: it changes where numbers live, never which numbers are computed):

- **mesh** `{"data": D, "expert": E}` over `devices = D x E`. Every device holds distinct tokens (the batch
  splits over all of them); dense weights (attention, embeddings, shared experts, router, latent
  projections) are FSDP-sharded over `data` (replicated over the E expert groups: the router's weight holds
  the experts' axis and the d_model axis, and one array cannot split two axes over the same mesh axis) and
  gathered a layer at a time; routed experts are split over `expert` (E groups of `n_experts / E` experts;
  the all-to-all that sends a token to its experts' devices stays inside one fast domain) and FSDP-sharded
  over `data` within a group, so over every device. steps/model/levanter_config.py's `trainer_mesh` builds
  this layout in Levanter's trainer.
- **precision**: f32 master weights, gradients and AdamW moments (4 + 4 + 8 bytes per parameter, sharded),
  bf16 compute (`compute_bytes` = 2; the CPU calibration runs f32, 4).
- **microbatch**: sequences per device per forward/backward pass, the largest divisor of the per-device
  batch whose activations fit beside the sharded state; layers are rematerialised (only each layer's input
  is kept for the backward pass).

`memory_per_device` adds up, per device: **parameters** (the f32 shard, plus the gathered compute copy of
two layers, the one running and the one prefetched, and of the embedding and head), **gradients** (f32
shard), **optimizer_state** (two f32 moments), **activations** (saved layer inputs, one layer's
rematerialised intermediates forward and backward, the routed copies and their all-to-all buffers, and,
with a kernel that materialises them, the attention scores). `plan_parallelism` keeps `HEADROOM` of the
device's memory free for XLA's own buffers and fragmentation and says whether the rest holds it (`fits`).

Calibration (tests/test_parallelism.py): the estimate's parameters + gradients + activations against the
compiled `memory_analysis()` of the real model's loss and gradient, on CPU in f32, for scaled-down shapes;
the error is stated in README.md's training section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jmp

from steps.model.levanter_config import uneven_splits
from steps.model.model_size import MoeShape, total_params
from steps.model.router_balance import RouterStatePolicy
from steps.train.hardware import Hardware

HEADROOM = 0.1
"""Share of a device's memory a plan leaves free (XLA's scratch, fragmentation, the runtime)."""
MAX_EXPERT_PARALLEL = 64
"""The widest expert-parallel group planned by default: the hero's published EP64."""
MASTER_BYTES, MOMENT_BYTES = 4, 8
LAYER_COPIES, SCORE_COPIES = 4, 3
"""Fitted to the compiled memory of the real model's gradient (`_activation_bytes`)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at its peak, by part."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    def parts(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "activations": self.activations,
        }

    def as_json(self) -> dict[str, int]:
        return {"total": self.total, **self.parts()}

    def largest(self) -> str:
        parts = self.parts()
        return max(parts, key=lambda name: parts[name])


@dataclass(frozen=True)
class ParallelismPlan:
    """Where a run's devices, tokens and weights go, and whether it fits. Plain: never versioned."""

    hardware: str
    hosts: int
    devices: int
    mesh: dict[str, int]
    """Axis name -> size; the sizes multiply to `devices`."""
    microbatch: int
    """Sequences per device per forward/backward pass (Levanter's `per_device_parallelism`)."""
    memory: MemoryEstimate
    memory_limit_bytes: int
    """What the plan may use of one device: its memory less `HEADROOM`."""
    fits: bool
    training: bool = True
    notes: list[str] = field(default_factory=list)
    uneven: tuple[str, ...] = ()
    """Dimensions the mesh would split unevenly (`levanter_config.uneven_splits`): such a plan cannot be laid
    out, whatever its memory, and is refused like one that does not fit."""

    def as_json(self) -> dict:
        return {
            "hardware": self.hardware,
            "hosts": self.hosts,
            "devices": self.devices,
            "mesh": dict(self.mesh),
            "microbatch": self.microbatch,
            "memory_per_device_bytes": self.memory.as_json(),
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
    policy = jmp.get_policy(f"p=f32,c={compute_dtype}")
    return RouterStatePolicy(policy.param_dtype, policy.compute_dtype, policy.output_dtype)


class PlanDoesNotFitError(ValueError):
    """A plan needs more memory per device than the hardware has: refused before any step runs."""


def expert_parallel_size(shape: MoeShape, devices: int, hardware: Hardware) -> int:
    """The largest E dividing both the experts and the devices, within one fast domain and `MAX_EXPERT_PARALLEL`."""
    limit = min(devices, hardware.fast_domain_devices, MAX_EXPERT_PARALLEL, shape.n_experts)
    return max(size for size in range(1, limit + 1) if shape.n_experts % size == 0 and devices % size == 0)


def memory_per_device(
    shape: MoeShape,
    mesh: dict[str, int],
    microbatch: int,
    *,
    training: bool = True,
    compute_bytes: int = 2,
    attention_scores: bool = False,
) -> MemoryEstimate:
    """The module docstring's estimate for `microbatch` sequences per device on `mesh`."""
    devices = math.prod(mesh.values())
    experts_per_device = shape.n_experts / mesh.get("expert", 1)
    sharded = _params_per_device(shape, mesh)
    shard = math.ceil(MASTER_BYTES * sharded)
    gathered = 0.0
    if devices > 1 or compute_bytes != MASTER_BYTES:  # a single f32 device computes on its master weights
        layer = _dense_layer_params(shape) + experts_per_device * _routed_params_per_expert(shape)
        gathered = compute_bytes * (2 * layer + _embedding_params(shape))
    tokens = microbatch * shape.seq_len
    activations = _activation_bytes(shape, tokens, experts_per_device, training, compute_bytes, attention_scores)
    return MemoryEstimate(
        parameters=int(shard + gathered),
        gradients=shard if training else 0,
        optimizer_state=math.ceil(MOMENT_BYTES * sharded) if training else 0,
        activations=int(activations),
    )


def plan_parallelism(
    shape: MoeShape,
    batch_size: int,
    hardware: Hardware,
    devices: int,
    *,
    training: bool = True,
    microbatch: int | None = None,
    capacity_factor: float | None = None,
) -> ParallelismPlan:
    """The default plan for `devices` of `hardware`; `microbatch` overrides the largest that fits."""
    if devices % hardware.devices_per_host:
        raise ValueError(f"{devices} devices are not whole hosts of {hardware.devices_per_host} {hardware.name}s")
    if batch_size % devices:
        raise ValueError(f"a batch of {batch_size} sequences does not split over {devices} devices")
    experts = expert_parallel_size(shape, devices, hardware)
    mesh = {"data": devices // experts, "expert": experts}
    limit = int(hardware.memory_bytes_per_device * (1 - HEADROOM))
    per_device = batch_size // devices
    candidates = [microbatch] if microbatch else [m for m in range(per_device, 0, -1) if per_device % m == 0]
    for size in candidates:
        memory = memory_per_device(shape, mesh, size, training=training)
        if memory.total <= limit:
            break
    return ParallelismPlan(
        hardware=hardware.name,
        hosts=devices // hardware.devices_per_host,
        devices=devices,
        mesh=mesh,
        microbatch=size,
        memory=memory,
        memory_limit_bytes=limit,
        fits=memory.total <= limit,
        training=training,
        uneven=tuple(uneven_splits(shape, mesh)),
    )


def refuse_unless_fits(step: str, plan: ParallelismPlan) -> None:
    """Raise PlanDoesNotFitError naming `step`, the largest term and what to change, when `plan` does not fit
    (or its mesh cannot be laid out: it splits a dimension unevenly)."""
    if plan.uneven:
        raise PlanDoesNotFitError(
            f"{step}: the mesh {plan.mesh} on {plan.devices} {plan.hardware} devices splits {', '.join(plan.uneven)} "
            "unevenly, which JAX cannot lay out; use a device count whose data axis (devices / expert) divides them"
        )
    if plan.fits:
        return
    largest = plan.memory.largest()
    advice = {
        "activations": "a smaller microbatch or sequence, or more devices",
        "parameters": "more devices (the weights shard over all of them) or hardware with more memory",
        "gradients": "more devices (gradients shard over all of them)",
        "optimizer_state": "more devices (AdamW's moments shard over all of them)",
    }[largest]
    raise PlanDoesNotFitError(
        f"{step}: needs {plan.memory.total / 1e9:,.1f} GB per device on {plan.devices} {plan.hardware} devices "
        f"(mesh {plan.mesh}, microbatch {plan.microbatch}) but may use {plan.memory_limit_bytes / 1e9:,.1f} GB; "
        f"the largest term is {largest} ({getattr(plan.memory, largest) / 1e9:,.1f} GB): use {advice}"
    )


def _params_per_device(shape: MoeShape, mesh: dict[str, int]) -> float:
    """Parameters one device holds of the master copy: the dense ones over `data`, the routed ones over all."""
    routed = shape.n_layers * shape.n_experts * _routed_params_per_expert(shape)
    dense = total_params(shape) - routed
    return dense / mesh.get("data", 1) + routed / math.prod(mesh.values())


def _routed_params_per_expert(shape: MoeShape) -> int:
    return 3 * (shape.latent_dim or shape.d_model) * shape.expert_width


def _embedding_params(shape: MoeShape) -> int:
    return (1 if shape.tied_embeddings else 2) * shape.vocab_size * shape.d_model


def _dense_layer_params(shape: MoeShape) -> int:
    """One (global, the larger) layer's weights outside the routed experts."""
    total = total_params(shape) - _embedding_params(shape)
    routed = shape.n_layers * shape.n_experts * _routed_params_per_expert(shape)
    return math.ceil((total - routed) / shape.n_layers)


def _activation_bytes(
    shape: MoeShape, tokens: int, experts_per_device: float, training: bool, compute_bytes: int, scores: bool
) -> float:
    """Activation bytes for `tokens` tokens on one device (module docstring). `scores`: the attention kernel
    materialises its (heads x context) scores (Levanter's vanilla attention, the CPU's), not flash attention.

    Levanter's fused next-token loss works through the vocabulary in blocks, so no tokens x vocab array is
    held: the calibration finds no logits term. The factors 4 (a layer's intermediates, rematerialised and
    differentiated) and 3 (scores, probabilities and their gradient) are fitted to XLA's compiled memory."""
    width = shape.d_model
    attention = 2 * shape.n_heads * shape.head_dim + 2 * shape.kv_heads_global * shape.head_dim
    expert_in = shape.latent_dim or width
    routed = shape.top_k * (2 * expert_in + 3 * shape.expert_width)  # copy in, gate, up, hidden; out
    dispatch = 2 * shape.top_k * expert_in if experts_per_device < shape.n_experts else 0  # all-to-all buffers
    shared = 3 * shape.n_shared_experts * shape.shared_width + (2 * expert_in if shape.latent_dim else 0)
    layer = tokens * (attention + routed + dispatch + shared + 4 * width) * compute_bytes
    if scores:
        layer_scores = SCORE_COPIES * tokens * shape.n_heads * shape.seq_len * compute_bytes
    else:
        layer_scores = 0
    if not training:
        return layer + layer_scores / SCORE_COPIES
    saved = shape.n_layers * tokens * width * compute_bytes
    return saved + LAYER_COPIES * layer + layer_scores
