"""Bytes per device of a train or evaluate step, term by term, for the model exactly as steps/model builds it.

The plan (steps/train/parallelism.py) adds these up for a mesh, a microbatch, a remat policy and an expert capacity,
and benchmarks/bench_plan_memory.py holds the sum against XLA's `compiled.memory_analysis()` of the real train step
(compiled in the benchmark itself) on scaled-down shapes with the hero's features.

**State** (`T` = parameters one device holds; every weight, dense or routed, is sharded over the whole mesh):

- parameters: the f32 master shard `4 T`, plus, on a mesh or in bf16, the compute copy XLA gathers: the layer
  running and the one prefetched (its dense weights and its device's routed experts) and the embeddings;
- gradients: `4 T`, and the accumulator beside it when the batch runs as several microbatches;
- optimizer_state: AdamW's two f32 moments `8 T`, and the update's own temporaries (`UPDATE_COPIES`). Under
  the hero's `hero` optimizer (steps/train/optimizer.py) each group holds its own state (`optimizer_groups`):
  MuonH's matrices one f32 momentum (`4 T_muonh`), AdamH's readout and Adam's rest two moments (`8 T_adam`), and
  the update's temporaries besides. The Newton-Schulz iteration's f32 iterate, Gram matrices and products
  (`NEWTON_SCHULZ_COPIES x 4 T_muonh`, every matrix's at once: the iteration runs over the stacks whole) live
  after the backward pass has freed its activations and take their place: they count only where they exceed the
  activations (the compiled hero probes hold no more than AdamW's less MuonH's missing moment: 43.98 MB against
  AdamW's 47.42 at the same shape, benchmarks/bench_plan_memory.py).

**Activations**, for `tokens` = microbatch x sequence tokens on the device, in compute bytes. One layer's *working
set* (what its forward and backward hold at once) is a sum of widths per token, each with a factor fitted to XLA's
compiled buffers of the real train step on one CPU device (`FACTORS`; 28 shapes, docs/training.md): the residual stream
(`d_model`), queries, keys and values, attention scores (only where the kernel materialises heads x sequence scores:
XLA's CPU attention; flash kernels keep none), the routed copies with their expert hidden units (capacity x K copies
a token with a capacity; K copies dropless, plus the dense `[copies, experts x width]` that XLA lowers a grouped
matmul to), the shared experts and the latent. The loss head's logits are priced whole (`head` x vocabulary per
token): on CPU Levanter's fused loss holds them once the vocabulary passes a few thousand; a kernel that streams
vocabulary blocks holds less, so this over-reserves.
What the backward pass keeps depends on the remat policy (steps/model/moe_layers.py):

- `layer`: every layer's input (`n_layers x d_model`), and one layer's working set;
- `period`: every period's input, and one period's layers' residuals besides the working set of the one in its
  backward pass;
- `none`: every layer's residuals.

A tail period (layers not a multiple of `global_every`) runs outside the scan of periods: under `period` it keeps
a working set of its own beside the scan's, and beside a single period (a scan of one, which XLA unrolls) its
layers' residuals too; under `layer` its layers keep their inputs like any other (a stack of one layer is kept
from XLA's common-subexpression merging, steps/model/moe_layers.py).

**Dispatch** (expert parallelism, `S` > 1, training): the backward all-to-all's received slot grids of one layer,
each `capacity_factor x K` copies per token (steps/model/expert_parallel.py), never `S x` the copies
(`dispatch_bytes`).

An evaluation holds the parameters' shard and compute copy and one layer's forward working set, no gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from steps.model.model_size import DROPLESS_ROUND_FACTOR, MoeShape, total_params

MASTER_BYTES, MOMENT_BYTES = 4, 8
UPDATE_COPIES = 1.36
"""f32 copies of the parameter shard AdamW's update holds as temporaries (its new moments and the update)."""
NEWTON_SCHULZ_COPIES = 3.0
"""f32 copies of the MuonH matrices' shard the Newton-Schulz iteration holds at once: the iterate, its Gram matrix
(no larger than the iterate) and their product."""
GATHERED_LAYERS = 2
"""Layers whose weights are gathered for compute at once: the one running and the one prefetched."""


@dataclass(frozen=True)
class WorkingSetFactors:
    """Copies of each width per token that one layer's forward and backward hold at once (`layer_widths`)."""

    stream: float
    attention: float
    scores: float
    routed: float
    dense_grouped: float
    shared: float
    head: float
    kept_input: float
    """What remat keeps of each layer (or period) for the backward pass, in residual-stream widths: its input and the
    scan's bookkeeping around it."""
    residuals: float
    """A layer's residuals kept for the backward pass (remat `none`), over its working set."""
    period_residuals: float
    """The same for each layer of the period in its backward pass (remat `period`): XLA frees some as it goes."""
    forward: float
    """One layer's forward-only working set (evaluation), over the training working set."""
    tail: float
    """A tail period (layers not a multiple of `global_every`) runs outside the scan of periods, and XLA keeps its
    working set apart from the scan's: this much more of a layer's working set, under `period` remat."""


FACTORS = WorkingSetFactors(
    stream=4.0, attention=2.0, scores=3.6, routed=1.5, dense_grouped=4.2, shared=2.0, head=0.8, kept_input=2.2,
    residuals=1.6, period_residuals=0.9, forward=0.4, tail=0.6,
)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at its peak, by part."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    dispatch: int = 0

    @property
    def total(self) -> int:
        return sum(self.parts().values())

    def parts(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "activations": self.activations,
            "dispatch": self.dispatch,
        }

    def as_json(self) -> dict[str, int]:
        return {"total": self.total, **self.parts()}

    def largest(self) -> str:
        parts = self.parts()
        return max(parts, key=lambda name: parts[name])


def memory_per_device(
    shape: MoeShape,
    mesh: dict[str, int],
    microbatch: int,
    *,
    training: bool = True,
    remat: str = "layer",
    capacity_factor: float | None = None,
    microbatches: int = 1,
    compute_bytes: int = 2,
    attention_scores: bool = False,
    optimizer: str = "adamw",
) -> MemoryEstimate:
    """The module docstring's sum for `microbatch` sequences per device per pass on `mesh`; `microbatches` passes
    make up the device's share of a batch. `attention_scores`: the attention kernel materialises its scores.
    `optimizer`: "adamw" or "hero" (steps/train/optimizer.py), whose state is priced group by group."""
    devices = math.prod(mesh.values())
    experts_per_device = shape.n_experts // mesh.get("expert", 1)
    shard = MASTER_BYTES * total_params(shape) / devices
    gathered = 0.0
    if devices > 1 or compute_bytes != MASTER_BYTES:  # one f32 device computes on its master weights
        layer = dense_layer_params(shape) + experts_per_device * routed_params_per_expert(shape)
        gathered = compute_bytes * (GATHERED_LAYERS * layer + embedding_params(shape))
    tokens = microbatch * shape.seq_len
    widths = layer_widths(shape, capacity_factor, attention_scores, expert_parallel=mesh.get("expert", 1) > 1)
    working = tokens * compute_bytes * working_set(widths)
    # What a layer keeps: the grouped matmul's dense lowering is transient (one projection at a time), its result is
    # the routed output; the same holds for an evaluation's forward pass.
    kept = tokens * compute_bytes * working_set({**widths, "dense_grouped": 0})
    head = tokens * compute_bytes * FACTORS.head * shape.vocab_size
    if training:
        activations = _kept_for_backward(shape, remat, tokens * compute_bytes, kept) + working + head
    else:
        activations = FACTORS.forward * kept + head
    state, newton_schulz = optimizer_state_bytes(shape, devices, optimizer)
    return MemoryEstimate(
        parameters=math.ceil(shard + gathered),
        gradients=math.ceil(shard * (2 if microbatches > 1 else 1)) if training else 0,
        optimizer_state=math.ceil(state + max(0.0, newton_schulz - activations)) if training else 0,
        activations=math.ceil(activations),
        dispatch=math.ceil(dispatch_bytes(shape, mesh, tokens, capacity_factor, compute_bytes, training)),
    )


def optimizer_groups(shape: MoeShape) -> dict[str, int]:
    """Parameters in each of the hero optimizer's groups (steps/train/optimizer.py `parameter_groups`): the lm-head
    readout in "adamh"; token embeddings, norms and the routers' gates in "adam"; every other matrix in "muonh"."""
    readout = 0 if shape.tied_embeddings else shape.vocab_size * shape.d_model
    norms = (2 * shape.n_layers + 1) * shape.d_model
    adam = shape.vocab_size * shape.d_model + norms + shape.n_layers * shape.n_experts * shape.d_model
    return {"muonh": total_params(shape) - readout - adam, "adamh": readout, "adam": adam}


def optimizer_state_bytes(shape: MoeShape, devices: int, optimizer: str) -> tuple[float, float]:
    """One device's optimizer state with the update's temporaries, and the Newton-Schulz iteration's temporaries
    (module docstring), every group sharded over all `devices`."""
    update = UPDATE_COPIES * MASTER_BYTES * total_params(shape) / devices
    if optimizer == "adamw":
        return MOMENT_BYTES * total_params(shape) / devices + update, 0.0
    if optimizer != "hero":
        raise ValueError(f"unknown optimizer {optimizer!r}")
    groups = optimizer_groups(shape)
    muonh = MASTER_BYTES * groups["muonh"] / devices
    adam = MOMENT_BYTES * (groups["adamh"] + groups["adam"]) / devices
    return muonh + adam + update, NEWTON_SCHULZ_COPIES * muonh


def _kept_for_backward(shape: MoeShape, remat: str, token_bytes: int, kept: float) -> float:
    """What the backward pass keeps beyond one layer's working set, per remat policy (module docstring); `kept` is
    the working set without the grouped matmul's transient dense lowering."""
    if remat == "none":
        return (shape.n_layers - 1) * FACTORS.residuals * kept
    inputs = FACTORS.kept_input * token_bytes * shape.d_model
    period = shape.global_every if shape.sliding_window is not None else 1
    periods, tail_layers = divmod(shape.n_layers, period)
    if remat == "layer":  # the tail's layers keep their inputs as every other layer does
        return shape.n_layers * inputs
    if remat == "period":
        tail = FACTORS.tail * kept if tail_layers else 0.0
        if tail_layers and periods == 1:
            # A scan of one period is unrolled, and XLA holds the tail's residuals beside the period's.
            tail += (tail_layers - 1) * FACTORS.period_residuals * kept
        return math.ceil(shape.n_layers / period) * inputs + (period - 1) * FACTORS.period_residuals * kept + tail
    raise ValueError(f"unknown remat policy {remat!r}")


def layer_widths(
    shape: MoeShape, capacity_factor: float | None, attention_scores: bool, expert_parallel: bool = False
) -> dict[str, float]:
    """Per token, the widths one layer's working set is made of (module docstring), as elements. Dropless under
    expert parallelism the copies go through rounds of the slot grid (`DROPLESS_ROUND_FACTOR` x K a token, one
    round at a time), never through the grouped matmul's dense lowering."""
    expert_in = shape.latent_dim or shape.d_model
    grouped = capacity_factor is None and not expert_parallel
    copies = shape.top_k * (capacity_factor or (DROPLESS_ROUND_FACTOR if expert_parallel else 1.0))
    return {
        "stream": shape.d_model,
        "attention": (shape.n_heads + 2 * max(shape.kv_heads_global, shape.kv_heads_local)) * shape.head_dim,
        "scores": shape.n_heads * shape.seq_len if attention_scores else 0,
        "routed": copies * (expert_in + shape.expert_width),
        "dense_grouped": shape.top_k * shape.n_experts * shape.expert_width if grouped else 0,
        "shared": shape.n_shared_experts * shape.shared_width + (shape.latent_dim or 0),
    }


def working_set(widths: dict[str, float]) -> float:
    """Elements per token of one layer's working set: each width times its factor."""
    return sum(getattr(FACTORS, name) * width for name, width in widths.items())


def dispatch_bytes(
    shape: MoeShape,
    mesh: dict[str, int],
    tokens: int,
    capacity_factor: float | None,
    compute_bytes: int,
    training: bool = True,
) -> float:
    """What expert parallelism adds to one layer's working set (zero without EP): the slot grid the layer fills is
    the all-to-all's send buffer on one device too (priced in the working set's routed copies), so EP adds the
    received grids of the backward pass, two; in an evaluation the received grid takes the sent one's place (the
    compiled eval on an expert mesh holds no more than on a data mesh). Dropless, the layer sends rounds of a grid
    of `DROPLESS_ROUND_FACTOR` x K copies per token (one round at a time, steps/model/expert_parallel.py), never S x
    the copies."""
    if mesh.get("expert", 1) == 1 or not training:
        return 0.0
    expert_in = shape.latent_dim or shape.d_model
    rows = tokens * shape.top_k * (capacity_factor or DROPLESS_ROUND_FACTOR)
    return 2 * rows * expert_in * compute_bytes


def routed_params_per_expert(shape: MoeShape) -> int:
    return 3 * (shape.latent_dim or shape.d_model) * shape.expert_width


def embedding_params(shape: MoeShape) -> int:
    return (1 if shape.tied_embeddings else 2) * shape.vocab_size * shape.d_model


def dense_layer_params(shape: MoeShape) -> int:
    """One layer's weights outside the routed experts (the layers' mean)."""
    total = total_params(shape) - embedding_params(shape)
    routed = shape.n_layers * shape.n_experts * routed_params_per_expert(shape)
    return math.ceil((total - routed) / shape.n_layers)
