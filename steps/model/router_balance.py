"""Aux-loss-free router-bias balancing: the rule, and the state that carries it from step to step.

Tokens are routed by the top K of logits + bias. The *excess* of expert e for token t is its biased score
minus the token's threshold, the (K+1)-th largest biased score: positive where e was chosen, zero where e was
the first expert left out. An expert gets its fair share K/E of tokens when the (1 - K/E) quantile of its
excesses is 0, so the next bias is the bias minus that quantile, centred per layer (minus the quantile's mean
over the layer's experts):

    bias' = bias - (Q - mean(Q)),    Q_e = (1 - K/E) quantile over the batch's tokens of excess_e

(the rule "minus the quantile of logit - threshold, centred", written about the current bias; it was computed
exactly per microbatch before, and is read from a histogram now).

**Whole-batch statistics, additive over microbatches.** Under gradient accumulation a step's batch runs as
sequential microbatches, and a quantile of each is not the batch's: averaging them made a step's training depend on
the microbatch size (a per-hardware memory setting, not part of the step's hash). So a batch is not reduced to a
quantile but to a histogram of each expert's excesses over a fixed grid, which adds up over microbatches and over
devices (an all-reduce of E x 257 numbers; no logit moves). Each excess is shared between the two grid points around
it, in proportion to its distance from each (linear, "cloud-in-cell" deposition), so the histogram, its piecewise-
linear CDF and the quantile read from it move continuously with the excesses: an excess that crosses a grid point by
a rounding error moves the next bias by about as much. (Counting each excess whole in its bin made the bias jump by
a share of a bin's width there.) The masses are f32 sums (`router_dtype`: f64 under a float64 policy), equal over
any split of the batch up to the order of additions. The quantile is read from the whole batch's histogram, where
its CDF reaches the quantile's share, when the next step routes. The grid is fine where a balanced expert's quantile
lies, near 0 (1e-4 apart), and coarse far out (10% of the offset), where a far-off quantile moves the bias a long
way and the next step refines it: `GRID = 1e-3 x sinh(0.1 j)`, j = -128..128, reaching +-181.

**The carried state** (`RouterBalance`, one per layer): the bias the last batch was routed by, that batch's
histogram and expert loads. `routing_bias()` is the bias the next batch is routed by (the update applied),
so a resumed run, an evaluation (which does not carry state) and a loaded export route as training would
next. It travels as a Haliax `CustomGradientAccumulation` (steps/model/moe_model.py's docstring says how);
folding microbatches adds histograms and loads and keeps the bias, the same in every microbatch. An export
`settle`s it: the routing bias with an empty histogram, which routes by its bias alone.

**Precision.** Levanter casts the model to the compute dtype inside the loss, so under bf16 the gradient that
carries the masses would round them past 256 (and the bias to three digits); `RouterStatePolicy`, the train
step's policy, keeps this state in f32 while it casts the weights; the router's logits and this arithmetic run in
at least f32 (`router_dtype`), in f64 under a float64 policy (where tests compare the update rule itself).

**Cost.** Two grid positions and two weighted bincounts per token, expert and layer: less than the 32 counting
rounds of the exact quantile it replaces, and an E x 257 state per layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

import equinox as eqx
import haliax as hax
import haliax.quantization as hq
import jax
import jax.numpy as jnp
import jmp
import numpy as np
from haliax import Axis, NamedArray

GRID_SCALE, GRID_STEP, GRID_HALF = 1e-3, 0.1, 128
GRID = GRID_SCALE * np.sinh(GRID_STEP * np.arange(-GRID_HALF, GRID_HALF + 1))
"""Excess values the histogram's mass sits at: 257 points, symmetric, with 0 among them."""
ExcessBin = Axis("excess_bin", GRID.size)
"""The histogram's points, one per `GRID` value; an excess past either end counts at that end."""


def router_dtype(dtype: Any) -> Any:
    """The precision the router computes in for values of `dtype`: at least f32 (bf16 compute rounds the router's
    logits and the excess masses too coarsely), f64 under a float64 policy (tests compare update rules there)."""
    return jnp.promote_types(dtype, jnp.float32)


def excess_histogram(excess: jax.Array) -> jax.Array:
    """Masses (experts, points) of `excess` (tokens, experts) at the `GRID` points, in at least f32 (`router_dtype`):
    each excess shared between the two points around it, linearly (module docstring); each token adds 1 per
    expert.

    The points around an excess are found by inverting the grid (asinh), so the cost is two sums per token and
    expert; over tokens split across devices that is a local sum and an all-reduce."""
    dtype = router_dtype(excess.dtype)
    grid = jnp.asarray(GRID, dtype)
    values = jnp.clip(excess.astype(dtype), grid[0], grid[-1])
    position = jnp.arcsinh(values / GRID_SCALE) / GRID_STEP + GRID_HALF
    lower = jnp.clip(jnp.floor(position).astype(jnp.int32), 0, GRID.size - 2)
    upper_share = jnp.clip((values - grid[lower]) / (grid[lower + 1] - grid[lower]), 0.0, 1.0)
    experts = excess.shape[-1]
    cell = (lower + jnp.arange(experts, dtype=jnp.int32) * ExcessBin.size).reshape(-1)
    length = experts * ExcessBin.size
    masses = jnp.bincount(cell, weights=(1.0 - upper_share).reshape(-1), length=length)
    masses = masses + jnp.bincount(cell + 1, weights=upper_share.reshape(-1), length=length)
    return masses.reshape(experts, -1).astype(dtype)


def excess_quantile(histogram: jax.Array, q: float) -> jax.Array:
    """Per expert, where the piecewise-linear CDF of `histogram` (..., experts, points) reaches a fraction `q` of
    its mass, read at rank q x mass + 1/2 (the midpoint convention, Hazen's; within [1/2, mass - 1/2]): linear
    between the two grid points around that place, the grid's first point if the mass there already reaches it;
    0 for an empty histogram.

    The half: each token adds a mass of 1, so where no excess lies the CDF is flat at a whole number of tokens,
    and q x tokens is a whole number too (3/4 x 512). Read there, the sums' rounding (their order: microbatches,
    devices) decided which end of the empty stretch the quantile took, moving the next bias by the stretch's width
    (2.6e-3 on data=2 x expert=2 in 2 microbatches, from one state). Half a token off, the CDF rises where it is
    read, and the quantile moves with the rounding by about as much."""
    cumulative = jnp.cumsum(histogram, axis=-1)  # the mass at or below each grid point
    total = histogram.sum(axis=-1)
    target = jnp.clip(q * total + 0.5, 0.5, total - 0.5)
    reached = jnp.sum(cumulative < target[..., None], axis=-1)  # the first grid point with enough mass
    lower, upper = jnp.clip(reached - 1, 0, GRID.size - 1), jnp.clip(reached, 0, GRID.size - 1)
    below, above = (jnp.take_along_axis(cumulative, index[..., None], axis=-1)[..., 0] for index in (lower, upper))
    grid = jnp.asarray(GRID, router_dtype(histogram.dtype))
    fraction = jnp.where(above > below, (target - below) / jnp.where(above > below, above - below, 1), 0)
    quantile = grid[lower] + (grid[upper] - grid[lower]) * fraction
    return jnp.where(total > 0, quantile, 0)


class RouterBalance(hq.CustomGradientAccumulation):
    """One layer's router bias, with the last batch's excess histogram and loads: carried by the gradient, never
    trained (module docstring)."""

    bias: NamedArray
    """The bias the last batch was routed by (Experts)."""
    load: NamedArray
    """Token-to-expert assignments of the last batch (Experts)."""
    excess: NamedArray
    """Histogram of the last batch's excesses (Experts, ExcessBin); all zero before the first batch, with
    balancing off, and in an export."""
    top_k: int = eqx.field(static=True)

    @staticmethod
    def init(experts: Axis, top_k: int) -> RouterBalance:
        return RouterBalance(hax.zeros(experts), hax.zeros(experts), hax.zeros((experts, ExcessBin)), top_k)

    def routing_bias(self) -> NamedArray:
        """The bias the next batch is routed by (in at least f32, `router_dtype`): `bias` moved by the last batch's
        excess quantiles (of each layer, for a state stacked over layers)."""
        dtype = router_dtype(self.bias.dtype)
        excess = self.excess.rearrange((*self.bias.axes, ExcessBin)).array.astype(dtype)
        quantile = excess_quantile(excess, 1.0 - self.top_k / self.bias.axes[-1].size)  # experts last, as built
        shift = quantile - jnp.mean(quantile, axis=-1, keepdims=True)
        return hax.named(self.bias.array.astype(dtype) - shift, self.bias.axes)

    def counted(self, bias: NamedArray, load: jax.Array, excess: jax.Array | None) -> RouterBalance:
        """The state a batch routed by `bias` leaves: its `load` (experts,) and `excess` histogram (None:
        balancing off, nothing counted)."""
        experts = self.bias.axes[-1]
        histogram = hax.zeros((experts, ExcessBin)) if excess is None else hax.named(excess, (experts, ExcessBin))
        return RouterBalance(bias, hax.named(load, experts), histogram, self.top_k)

    def settled(self) -> RouterBalance:
        """This state as an export holds it: the routing bias, in the bias's dtype, and an empty histogram."""
        bias = self.routing_bias().astype(self.bias.dtype)
        return dataclasses.replace(self, bias=bias, excess=hax.zeros_like(self.excess))

    def accumulate(self, other: Self) -> Self:
        # Every microbatch routes by the same bias; `self` is zero on the first fold, which adding leaves as is.
        return dataclasses.replace(other, load=self.load + other.load, excess=self.excess + other.excess)

    def carry_term(self, carried: RouterBalance) -> NamedArray:
        """A loss term of value 0 whose gradient with respect to this state is `carried`."""

        def carry(leaf: NamedArray, value: NamedArray) -> NamedArray:
            product = hax.sum(leaf * jax.lax.stop_gradient(value))
            return product - jax.lax.stop_gradient(product)

        return carry(self.bias, carried.bias) + carry(self.load, carried.load) + carry(self.excess, carried.excess)


def is_router_state(node: Any) -> bool:
    return isinstance(node, RouterBalance)


def settled(tree: Any) -> Any:
    """`tree` (a model) with every `RouterBalance` settled."""
    return jax.tree.map(lambda node: node.settled() if is_router_state(node) else node, tree, is_leaf=is_router_state)


@dataclasses.dataclass(frozen=True)
class RouterStatePolicy(jmp.Policy):
    """A jmp mixed-precision policy that casts every floating leaf to compute precision but the router state:
    Levanter casts the whole model inside the loss, and bf16 would round the excess masses (and the bias)."""

    def cast_to_compute(self, x: Any) -> Any:
        cast = super().cast_to_compute
        return jax.tree.map(lambda node: node if is_router_state(node) else cast(node), x, is_leaf=is_router_state)

    def __eq__(self, other: object) -> bool:
        # Equal to jmp's policy of the same dtypes (either way round: Python asks the subclass first). Levanter's
        # config encoder writes a policy as its dtypes and checks that jmp reads back an equal one.
        dtypes = (self.param_dtype, self.compute_dtype, self.output_dtype)
        return isinstance(other, jmp.Policy) and dtypes == (other.param_dtype, other.compute_dtype, other.output_dtype)
