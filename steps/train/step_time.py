"""A roofline bound of one train step's time, from its plan, and a forecast of it: what the MFU could be, and
what to expect.

The bound is an estimate, never a measurement: each term is the least time the hardware's published peaks allow
(steps/train/hardware.py), and what a real step loses besides (kernels below peak, load imbalance between
experts, launch gaps, stragglers) is not in it, so it bounds the step time from below and the MFU from above.
Marin's hero reached ~23% MFU on GB200 and its d2048 rung 13.6%; docs/hero.md sets the estimates beside them.

Per device and train step (`tokens` its share of the batch, `passes` its microbatches, `r` = 1 where the plan
recomputes each layer's forward pass, remat "layer" or "period", else 0):

- **matmul**: (model FLOPs + r x the layers' forward FLOPs) / bf16 peak; model FLOPs are steps/model/
  model_size.py's (6 x active + the head + attention), the numerator of MFU.
- **HBM**: bytes read and written / HBM bandwidth: the compute copy of every weight the device gathers, read
  (2 + r) times a pass (forward, backward, recompute); each layer's working set (steps/train/memory_model.py)
  written and read once, (2 + r) / 2 times a pass; the head's logits four times (written and read, forward and
  backward); AdamW reading the master weights, gradient and two moments and writing three of them (28 bytes a
  parameter it holds); with microbatches, the gradient accumulator read and written every pass.
- **collectives** (`Collective`), each on its mesh axis, bytes received by one device: the routed copies'
  all-to-all over `expert` (dispatch and combine, forward, backward and recompute: 2 (2 + r) a layer and pass,
  capacity factor x K rows a token, the (E - 1) / E of them bound for other devices); the weights' all-gathers
  over data x expert (dense: every device holds 1 / devices of them) and over `data` (each device's routed
  experts: FSDP within the expert group), (2 + r) a pass in compute bytes; their gradients' reduce-scatters,
  once a pass in f32. Hierarchically, the cross-domain share of a gather over data x expert is 1 / E of the
  array's (D - 1) / D (each device fetches its own column from the other domains, then shares it on the fast
  link); `data` crosses domains when the devices outnumber one fast domain (the mesh puts `expert` inside one).
- **step time**: max(matmul, HBM) for compute; the weights' gathers and gradients' reduce-scatters are
  prefetched and overlap it (the plan holds the next layer's gathered copy), the fast and slow links at once;
  the all-to-alls do not overlap (a layer's experts wait for their tokens):
  `step = max(compute, max(fsdp on fast links, fsdp on slow links)) + all-to-all`. `serial` adds every term.

The forecast (`forecast_step_time`, `StepTimeForecast`) adds what the bound leaves out, each term derived from
the plan and recipe (the slot grid's capacity padding, memory-bound kernels, exposed FSDP traffic, the evals and
checkpoints spread over the steps), and two efficiencies, the matmuls' share of peak and the all-to-alls' share of
the fast link, fitted to Marin's two published MFUs (`fit_efficiency`, `PUBLISHED_MFU`): 71.3% and 13.1%, which
give the hero 11.7 s a step (23.0%) where the bound gives 4.37 s (at most 62%).

An eval completes no train step, and a gang's watch allows only so long without one: `eval_allowance_s` is how
long one eval of a run may take, its first compile included, from the eval's forward FLOPs (`eval_seconds`, the
roofline bound) at a stated low efficiency. The plan sets a train step's progress allowance from it
(experiments/train_defaults.py `Rung.train_resources`). For the full hero on 1,024 GB200s, an eval of 216 sets x
4 batches of 1,024 sequences of 4,096 tokens is at least 71 s; its allowance is 1,800 + 71 / 0.1 = 2,506 s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from steps.model.model_size import DROPLESS_ROUND_FACTOR, MoeShape, data_parallel_size, flops_per_token
from steps.train.hardware import Hardware
from steps.train.memory_model import (
    dense_layer_params,
    embedding_params,
    layer_widths,
    routed_params_per_expert,
    working_set,
)
from steps.train.parallelism import ParallelismPlan, devices_per_domain

OPTIMIZER_BYTES_PER_PARAM = 28
"""AdamW's step reads the f32 master weight, gradient and two moments and writes the weight and moments back."""
GRADIENT_BYTES = 4
"""Gradients are reduce-scattered in f32, the master weights' dtype."""
EVAL_COMPILE_S = 1800.0
"""What a run's first eval may spend compiling its forward program, besides running it: half the hour a train
step's first compile (forward and backward) is given (`ResourceConfig.first_step_timeout_s`'s default)."""
EVAL_EFFICIENCY = 0.1
"""The share of the devices' bf16 peak the eval allowance assumes an eval reaches: below any MFU Marin published
for a train step (13.6% at d2048, about 23% for the hero), so that a slow eval still fits."""


@dataclass(frozen=True)
class Collective:
    """One kind of collective of a train step: on which mesh axis, whether it leaves the fast domain, how much."""

    name: str
    axis: str
    crosses_domains: bool
    fast_bytes: float
    """Bytes one device receives per step over its fast domain's links."""
    slow_bytes: float
    """Bytes one device receives per step from other fast domains."""
    overlapped: bool
    """Whether it runs beside the compute (prefetched weights, gradients) or on its critical path (all-to-all)."""


@dataclass(frozen=True)
class StepTimeEstimate:
    """Seconds per train step by term (module docstring), and what they give."""

    matmul_s: float
    hbm_s: float
    fsdp_s: float
    all_to_all_s: float
    collectives: tuple[Collective, ...]
    model_flops_per_device: float
    peak_flops_per_device: float
    tokens_per_step: int

    @property
    def step_s(self) -> float:
        return max(self.matmul_s, self.hbm_s, self.fsdp_s) + self.all_to_all_s

    @property
    def serial_s(self) -> float:
        """Nothing overlapped: every term one after another."""
        return self.matmul_s + self.hbm_s + self.fsdp_s + self.all_to_all_s

    @property
    def mfu(self) -> float:
        return self.model_flops_per_device / (self.step_s * self.peak_flops_per_device)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    def as_json(self) -> dict:
        return {
            "step_s": self.step_s,
            "serial_s": self.serial_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "terms_s": self.terms_s(),
            "collectives": [dataclasses.asdict(collective) for collective in self.collectives],
        }

    def terms_s(self) -> dict[str, float]:
        return {"matmul": self.matmul_s, "hbm": self.hbm_s, "fsdp": self.fsdp_s, "all_to_all": self.all_to_all_s}


def estimate_step_time(
    shape: MoeShape, plan: ParallelismPlan, hardware: Hardware, compute_bytes: int = 2
) -> StepTimeEstimate:
    """The module docstring's estimate for a train step's `plan` on `hardware`, computing in `compute_bytes`."""
    if not plan.training:
        raise ValueError("the step-time estimate is for train steps; an evaluate step's plan has no backward pass")
    data, experts = data_parallel_size(plan.mesh), plan.mesh.get("expert", 1)
    passes = plan.batch_size // plan.devices // plan.microbatch
    recompute = 0 if plan.remat == "none" else 1
    reads = 2 + recompute  # forward, backward and the recomputed forward
    tokens = plan.batch_size * shape.seq_len // plan.devices
    pass_tokens = plan.microbatch * shape.seq_len

    head_flops = 6 * shape.d_model * shape.vocab_size
    model_flops = flops_per_token(shape) * tokens
    forward_layer_flops = (flops_per_token(shape) - head_flops) / 3 * tokens
    matmul_s = (model_flops + recompute * forward_layer_flops) / hardware.peak_flops_per_device

    local_experts = shape.n_experts // experts
    dense = shape.n_layers * dense_layer_params(shape) + embedding_params(shape)
    routed = shape.n_layers * local_experts * routed_params_per_expert(shape)
    held = (dense + shape.n_layers * shape.n_experts * routed_params_per_expert(shape)) / plan.devices
    widths = layer_widths(shape, plan.capacity_factor, attention_scores=False)
    layer_bytes = pass_tokens * compute_bytes * working_set(widths)
    weights = reads * compute_bytes * (dense + routed)
    per_pass = weights + reads * layer_bytes * shape.n_layers + 4 * pass_tokens * shape.vocab_size * compute_bytes
    accumulate = 2 * GRADIENT_BYTES * held if passes > 1 else 0.0
    hbm = passes * (per_pass + accumulate) + OPTIMIZER_BYTES_PER_PARAM * held
    hbm_s = hbm / hardware.hbm_bytes_per_s

    crosses = domains_used(plan, hardware)[0] > 1
    gathered, scattered = passes * reads * compute_bytes, passes * GRADIENT_BYTES  # bytes per parameter and step
    outer = " x ".join(axis for axis in ("domain", "data") if axis in plan.mesh) or "data"  # data parallel axes
    dense_axis = (f"{outer} x expert", dense, data, experts, crosses)
    routed_axis = (outer, routed, data, 1, crosses)
    collectives = (
        _all_to_all(shape, plan, experts, passes * pass_tokens, reads, compute_bytes),
        _gathered("all-gather of dense weights", *dense_axis, gathered),
        _gathered("all-gather of routed experts", *routed_axis, gathered),
        _gathered("reduce-scatter of dense gradients", *dense_axis, scattered),
        _gathered("reduce-scatter of routed gradients", *routed_axis, scattered),
    )
    overlapped = [c for c in collectives if c.overlapped]
    fast_s = sum(c.fast_bytes for c in overlapped) / hardware.fast_link_bytes_per_s
    fsdp_s = max(fast_s, sum(c.slow_bytes for c in overlapped) / hardware.slow_link_bytes_per_s)
    all_to_all_s = sum(c.fast_bytes for c in collectives if not c.overlapped) / hardware.fast_link_bytes_per_s
    return StepTimeEstimate(
        matmul_s=matmul_s,
        hbm_s=hbm_s,
        fsdp_s=fsdp_s,
        all_to_all_s=all_to_all_s,
        collectives=tuple(c for c in collectives if c.fast_bytes or c.slow_bytes),
        model_flops_per_device=model_flops,
        peak_flops_per_device=hardware.peak_flops_per_device,
        tokens_per_step=plan.batch_size * shape.seq_len,
    )


def _all_to_all(
    shape: MoeShape, plan: ParallelismPlan, experts: int, tokens: int, reads: int, compute_bytes: int
) -> Collective:
    """The routed copies to their experts' devices and back, inside one fast domain (the plan keeps E within it)."""
    rows = tokens * shape.top_k * (plan.capacity_factor or DROPLESS_ROUND_FACTOR)
    sent = 2 * reads * shape.n_layers * rows * (shape.latent_dim or shape.d_model) * compute_bytes
    return Collective("all-to-all of routed copies", "expert", False, sent * (experts - 1) / experts, 0.0, False)


def _gathered(
    name: str, axis: str, params: float, data: int, inner: int, crosses: bool, bytes_each: float
) -> Collective:
    """A gather (or reduce-scatter) of `params` split over data x `inner` devices, `bytes_each` per parameter and
    step: hierarchically, the other domains' share of the device's own column over the slow link, the rest fast."""
    whole = params * bytes_each
    devices = data * inner
    if not crosses:
        return Collective(name, axis, False, whole * (1 - 1 / devices), 0.0, True)
    slow = whole / inner * (data - 1) / data
    return Collective(name, axis, True, whole * (inner - 1) / inner, slow, True)


def domains_used(plan: ParallelismPlan, hardware: Hardware) -> tuple[int, int]:
    """(fast domains, devices used in each) of the plan (`parallelism.devices_per_domain`)."""
    per_domain = devices_per_domain(plan.devices, plan.mesh.get("expert", 1), hardware)
    return math.ceil(plan.devices / per_domain), per_domain


def eval_seconds(shape: MoeShape, sequences: int, hardware: Hardware, devices: int) -> float:
    """The least time one eval of `sequences` sequences takes on `devices` of `hardware`: its forward FLOPs (a
    third of a train step's per token) at the devices' bf16 peak."""
    forward_flops = flops_per_token(shape) / 3 * sequences * shape.seq_len
    return forward_flops / (devices * hardware.peak_flops_per_device)


def eval_allowance_s(shape: MoeShape, sequences: int, hardware: Hardware, devices: int) -> float:
    """How long one eval of `sequences` sequences may take, its first compile included (module docstring):
    `EVAL_COMPILE_S` plus its forward FLOPs at `EVAL_EFFICIENCY` of the devices' peak."""
    return EVAL_COMPILE_S + eval_seconds(shape, sequences, hardware, devices) / EVAL_EFFICIENCY


PUBLISHED_MFU = {"d2048": 0.136, "d6144": 0.23}
"""Marin's measured MFU on GB200, by rung: its d2048 ladder rung and the hero (their issue #8549). The forecast's
two efficiencies are fitted to these two points (`fit_efficiency`), nothing else."""


@dataclass(frozen=True)
class Efficiency:
    """What a real step reaches of the two peaks the bound is mostly made of. Fitted (`FITTED_EFFICIENCY`)."""

    matmul: float
    """Share of the bf16 peak the matmuls reach: attention and the small per-expert matmuls below peak, kernel
    launch gaps, stragglers."""
    all_to_all: float
    """Share of the fast link's bandwidth the expert all-to-alls reach: small messages, uneven routing."""


FITTED_EFFICIENCY = Efficiency(matmul=0.7128, all_to_all=0.1309)
"""`fit_efficiency` on the full-scale GB200 plans of d2048 and the hero at `PUBLISHED_MFU` (refit by
tests/steps/train/test_step_forecast.py, which fails if a plan change moves them)."""


@dataclass(frozen=True)
class StepTimeForecast:
    """An expected train step time beside the roofline bound (`bound`): the terms the bound leaves out, each
    derived from the plan and recipe, and the two fitted efficiencies.

    - **compute**: the bound's matmul time, the routed experts' share padded to the capacity the slot grid
      computes (capacity factor, or dropless rounding: derived), at the fitted matmul efficiency;
    - **memory**: the bound's HBM time, serial: norms, routing, activations and the optimizer are kernels of
      their own, not hidden under the matmuls (derived);
    - **all-to-all**: the bound's, at the fitted link efficiency;
    - **exposed FSDP**: gathers and reduce-scatters past the compute they overlap (derived);
    - **eval**: the run's evals spread over its steps, their forward FLOPs at the matmul efficiency (derived);
    - **checkpoints**: the share of wall-clock spent writing the device's weights and optimizer state over the
      slow link, once every temporary-checkpoint interval (derived).
    """

    bound: StepTimeEstimate
    efficiency: Efficiency
    routed_padding: float
    """The matmuls' time over the bound's: 1 + routed share of the FLOPs x (capacity factor - 1)."""
    eval_bound_s: float
    """The evals' least time per train step."""
    checkpoint_share: float
    """Wall-clock share spent writing checkpoints."""

    @property
    def compute_s(self) -> float:
        return self.bound.matmul_s * self.routed_padding / self.efficiency.matmul

    @property
    def all_to_all_s(self) -> float:
        return self.bound.all_to_all_s / self.efficiency.all_to_all

    @property
    def exposed_fsdp_s(self) -> float:
        return max(0.0, self.bound.fsdp_s - self.compute_s)

    @property
    def eval_s(self) -> float:
        return self.eval_bound_s / self.efficiency.matmul

    @property
    def step_s(self) -> float:
        work = self.compute_s + self.bound.hbm_s + self.all_to_all_s + self.exposed_fsdp_s + self.eval_s
        return work / (1 - self.checkpoint_share)

    @property
    def mfu(self) -> float:
        return self.bound.model_flops_per_device / (self.step_s * self.bound.peak_flops_per_device)

    def terms_s(self) -> dict[str, float]:
        return {"compute": self.compute_s, "memory": self.bound.hbm_s, "all_to_all": self.all_to_all_s,
                "exposed_fsdp": self.exposed_fsdp_s, "eval": self.eval_s,
                "checkpoints": self.step_s * self.checkpoint_share}  # fmt: skip

    def as_json(self) -> dict:
        return {"step_s": self.step_s, "mfu": self.mfu, "terms_s": self.terms_s(),
                "efficiency": dataclasses.asdict(self.efficiency), "routed_padding": self.routed_padding}  # fmt: skip


def forecast_step_time(
    shape: MoeShape,
    plan: ParallelismPlan,
    hardware: Hardware,
    *,
    steps: int,
    evals: int,
    eval_sequences: int,
    checkpoint_interval_s: float,
    efficiency: Efficiency = FITTED_EFFICIENCY,
) -> StepTimeForecast:
    """The expected step time of a train step's `plan` (`StepTimeForecast`): a run of `steps` steps with `evals`
    evals of `eval_sequences` sequences each, writing a checkpoint every `checkpoint_interval_s` seconds."""
    routed_share = 6 * shape.n_layers * shape.top_k * routed_params_per_expert(shape) / flops_per_token(shape)
    capacity = plan.capacity_factor or DROPLESS_ROUND_FACTOR
    state_bytes = plan.memory.parameters + plan.memory.optimizer_state
    return StepTimeForecast(
        bound=estimate_step_time(shape, plan, hardware),
        efficiency=efficiency,
        routed_padding=1 + routed_share * (capacity - 1),
        eval_bound_s=evals * eval_seconds(shape, eval_sequences, hardware, plan.devices) / steps,
        checkpoint_share=state_bytes / hardware.slow_link_bytes_per_s / checkpoint_interval_s,
    )


def fit_efficiency(forecasts: list[tuple[StepTimeForecast, float]]) -> Efficiency:
    """The two efficiencies that give two forecasts their measured MFUs (`(forecast, mfu)` pairs; the forecasts'
    own efficiencies are ignored): solved exactly, the step times being linear in 1 / matmul and 1 / all-to-all
    where no FSDP is exposed."""
    if len(forecasts) != 2:
        raise ValueError(f"two measured points fit the two efficiencies, got {len(forecasts)}")
    rows = []
    for forecast, mfu in forecasts:
        measured_step = forecast.bound.model_flops_per_device / (mfu * forecast.bound.peak_flops_per_device)
        matmul = forecast.bound.matmul_s * forecast.routed_padding + forecast.eval_bound_s
        rest = measured_step * (1 - forecast.checkpoint_share) - forecast.bound.hbm_s
        rows.append((matmul, forecast.bound.all_to_all_s, rest))
    (a, b, e), (c, d, f) = rows
    determinant = a * d - b * c
    inverse_matmul, inverse_all_to_all = (e * d - b * f) / determinant, (a * f - e * c) / determinant
    return Efficiency(matmul=1 / inverse_matmul, all_to_all=1 / inverse_all_to_all)
