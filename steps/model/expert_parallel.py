"""Expert parallelism: routed experts split over the mesh's `expert` axis, tokens sent to them by all-to-all.

On a mesh with an `expert` axis of size S > 1, each device holds `E / S` of a layer's routed experts and its
own slice of the tokens (tokens split over every mesh axis, `data` and `expert`). A device:

1. packs its token copies (one per chosen expert) into a send buffer, the **slot grid** `[experts, groups,
   slots]` (GShard's and Marin's grug `ep_fixed_all_to_all` layout): each expert takes at most `slots` copies
   from each group of `tokens` consecutive tokens (a sequence), the first ones in token order. Experts-major,
   so device s's experts are one contiguous block of rows and a row's place says its expert;
2. exchanges the grids with one `all_to_all` over `expert` (block s goes to device s of its group);
3. runs its experts on what it received;
4. sends the outputs back by the reverse `all_to_all`, and sums each token's copies weighted by its gates.

No collective carries the whole token batch: the two all-to-alls move each device's own routed copies
(tests/steps/model/test_expert_parallel.py reads the compiled HLO). The grid is `E x groups x slots` rows of `feature`
per device, about the capacity factor times its copies (tokens x K), whatever S. Two ways to use it:

- **capacity** (`dropless=False`): one pass; a copy past its expert's slots in its group is dropped (no
  output from that expert) and counted (`routed_experts` returns each token's dropped copies);
- **dropless**: the same pass in rounds, round r serving each (expert, group) cell's copies of rank
  [r x slots, (r + 1) x slots). Every device of an expert group must run each all-to-all, so all run as many
  rounds as the fullest cell of the group needs (a `pmax`): one or two for a balanced router, more for a
  skewed one, each in the same grid-sized buffers. Sending every copy in one buffer sized for the worst
  case (all of a device's copies to one destination) would take S x copies rows per buffer (69 GB at EP64
  for the d2048 rung's evaluate step), and `ragged_all_to_all`, which sends only what each destination
  gets, is not implemented by XLA's CPU backend. The rounds' gradient is computed round by round too
  (`_in_rounds`: a while loop's trip count is not known to reverse-mode autodiff).

The same grid (`copy_ranks`, `grid_rows`, `dispatch`, `combine`) serves the layer on one device
(steps/model/moe_block.py), so a token is dropped on a mesh exactly when it is on one device: a group is a
sequence, and a device holds whole sequences, whatever the mesh or the microbatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

EXPERT_AXIS = "expert"


class CapacityGroups(NamedTuple):
    """Expert capacity: each expert serves at most `slots` copies from each group of `tokens` consecutive tokens."""

    tokens: int
    """Tokens per group: a sequence's length (a device always holds whole sequences)."""
    slots: int
    """Copies an expert takes from one group (`capacity_groups`)."""


Mlp = tuple[jax.Array, jax.Array, jax.Array]
"""A device's local experts' (gate, up, down) weights."""


def capacity_groups(capacity_factor: float, group_tokens: int, top_k: int, experts: int) -> CapacityGroups:
    """An expert's slots per group: `capacity_factor` x its fair share of the group's copies, rounded up."""
    return CapacityGroups(group_tokens, max(1, math.ceil(capacity_factor * group_tokens * top_k / experts)))


def copy_ranks(chosen: jax.Array, capacity: CapacityGroups, experts: int) -> tuple[jax.Array, jax.Array]:
    """Each copy's cell of the slot grid and its rank in the cell, for `chosen` (tokens, K) flattened: copy
    i (token i // K) of group g sent to expert e lies in cell e x groups + g, and is the j-th of that cell's
    copies in token order."""
    tokens, top_k = chosen.shape
    if tokens % capacity.tokens:
        raise ValueError(
            f"{tokens} tokens do not split into capacity groups of {capacity.tokens} (a sequence): under expert "
            "parallelism each device must hold whole sequences; give the batch a multiple of the devices"
        )
    groups = tokens // capacity.tokens
    cell = chosen.reshape(-1) * groups + jnp.arange(tokens * top_k) // (capacity.tokens * top_k)
    order = jnp.argsort(cell, stable=True)  # by (expert, group), token order within each
    counts = jnp.bincount(cell, length=experts * groups)
    rank_sorted = jnp.arange(cell.size) - (jnp.cumsum(counts) - counts)[cell[order]]
    return cell, jnp.zeros_like(cell).at[order].set(rank_sorted)


def grid_rows(cell: jax.Array, rank: jax.Array, slots: int, cells: int, first: jax.Array | int = 0) -> jax.Array:
    """Each copy's row in the slot grid `[cells, slots]` (flattened) when the copies of rank [first, first +
    slots) of each cell are served: row cell x slots + rank - first; any other copy gets the row one past
    the grid's end, which `dispatch` and `combine` skip."""
    served = (rank >= first) & (rank < first + slots)
    return jnp.where(served, cell * slots + rank - first, cells * slots)


def capacity_slots(chosen: jax.Array, capacity: CapacityGroups, experts: int) -> tuple[jax.Array, jax.Array]:
    """Each copy's row in the slot grid `[experts, groups, slots]` with capacity (the first `slots` copies
    of each cell kept), and each token's dropped copies (tokens,)."""
    cell, rank = copy_ranks(chosen, capacity, experts)
    cells = experts * (chosen.shape[0] // capacity.tokens)
    return grid_rows(cell, rank, capacity.slots, cells), dropped_copies(rank, capacity, chosen.shape[1])


def dropped_copies(rank: jax.Array, capacity: CapacityGroups, top_k: int) -> jax.Array:
    """Each token's copies past their expert's capacity (tokens,), from the copies' ranks in their cells."""
    return jnp.sum((rank >= capacity.slots).reshape(-1, top_k), axis=-1)


def dispatch(x: jax.Array, slots: jax.Array, rows: int) -> jax.Array:
    """The slot grid (rows, feature) filled with each kept copy's token of `x` (tokens, feature); empty rows 0."""
    top_k = slots.size // x.shape[0]
    copies = jnp.repeat(x, top_k, axis=0)  # copy i is token i // K
    return jnp.zeros((rows, x.shape[-1]), x.dtype).at[slots].set(copies, mode="drop")


def combine(out_rows: jax.Array, slots: jax.Array, weights: jax.Array) -> jax.Array:
    """Each token's copies read back from the grid's outputs (0 for a dropped copy), summed by their gate
    `weights` (tokens, K)."""
    out = jnp.take(out_rows, slots, axis=0, mode="fill", fill_value=0)
    return jnp.einsum("tkf,tk->tf", out.reshape(*weights.shape, -1), weights.astype(out_rows.dtype))


def swiglu_experts(
    rows: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    activation: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """Each expert's SwiGLU on its own rows, (experts, n, feature), as batched dense matmuls (an empty row,
    all zeros, gives zeros). XLA runs these at dense-matmul speed on CPU, where its grouped matmul
    (`ragged_dot`) runs at about a seventh of it."""
    hidden = activation(jnp.einsum("enf,efw->enw", rows, gate)) * jnp.einsum("enf,efw->enw", rows, up)
    return jnp.einsum("enw,ewf->enf", hidden, down)


def expert_parallel_size(mesh: Mesh | None) -> int:
    """The size of the mesh's `expert` axis (1 without one)."""
    if mesh is None or EXPERT_AXIS not in mesh.axis_names:
        return 1
    return int(mesh.shape[EXPERT_AXIS])


def splits_tokens(mesh: Mesh | None) -> bool:
    """Whether the mesh splits tokens over more than one device (any data, domain or expert parallelism): each
    device then routes and serves its own sequences, with a slot grid of its own sequences' size."""
    return mesh is not None and math.prod(int(mesh.shape[name]) for name in token_axes(mesh)) > 1


def token_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes tokens are split over: every axis but tensor parallelism's `model`."""
    return tuple(name for name in mesh.axis_names if name != "model")


def shard_tokens(mesh: Mesh, array: jax.Array) -> jax.Array:
    """`array` (tokens, ...) split over the token axes: flattening (batch, position) into tokens loses the
    batch's sharding, and XLA then gathers the whole batch onto every device for the router and the experts."""
    return jax.lax.with_sharding_constraint(array, NamedSharding(mesh, P(token_axes(mesh))))


def replicated(mesh: Mesh, array: jax.Array) -> jax.Array:
    """`array` whole on every device."""
    return jax.lax.with_sharding_constraint(array, NamedSharding(mesh, P()))


def local_top_k(mesh: Mesh | None, scores: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k(scores, k)` of (tokens, experts) `scores`, each device on its own tokens. XLA's SPMD
    partitioner does not split TopK over a sharded batch dimension: it all-gathers the operand, the whole
    batch's router scores (tokens x experts) onto every device, once per layer. Top-k is per token, so on a mesh
    that splits tokens (`splits_tokens`) it runs inside `shard_map` instead."""
    if not splits_tokens(mesh):
        return jax.lax.top_k(scores, k)
    assert mesh is not None  # splits_tokens is False without a mesh
    tokens = P(token_axes(mesh))

    def per_device(local: jax.Array) -> tuple[jax.Array, jax.Array]:
        values, indices = jax.lax.top_k(local, k)
        return values, indices

    return shard_map(per_device, mesh=mesh, in_specs=tokens, out_specs=(tokens, tokens))(scores)


def routed_experts(
    mesh: Mesh,
    x: jax.Array,
    chosen: jax.Array,
    weights: jax.Array,
    gate_up: tuple[jax.Array, jax.Array],
    down: jax.Array,
    activation: Callable[[jax.Array], jax.Array],
    capacity: CapacityGroups,
    dropless: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The weighted sum over each token's chosen experts of their SwiGLU outputs, experts split over `expert`,
    and each token's dropped copies: with `capacity`'s slot grid each expert takes at most `capacity.slots`
    copies of each group, or (`dropless`) every copy, in as many rounds of that grid as needed (module
    docstring).

    `x` (tokens, feature), `chosen` and `weights` (tokens, K), `gate_up` = (gate, up) weights (E, feature,
    width), `down` (E, width, feature).

    On a mesh without expert parallelism (`expert` of size 1 or absent) every device holds every expert and
    serves its own tokens' grid, no all-to-all: the slot grid is sized by the device's own sequences, as under
    expert parallelism, never by the global batch."""
    tokens = P(token_axes(mesh))
    experts = P(EXPERT_AXIS) if expert_parallel_size(mesh) > 1 else P()
    run = partial(
        _local, activation=activation, shards=expert_parallel_size(mesh), capacity=capacity, dropless=dropless
    )
    sharded = shard_map(
        run,
        mesh=mesh,
        in_specs=(tokens, tokens, tokens, experts, experts, experts),
        out_specs=(tokens, tokens),
        check_vma=False,
    )
    return sharded(x, chosen, weights, gate_up[0], gate_up[1], down)


def _local(
    x: jax.Array,
    chosen: jax.Array,
    weights: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    *,
    activation: Callable[[jax.Array], jax.Array],
    shards: int,
    capacity: CapacityGroups,
    dropless: bool,
) -> tuple[jax.Array, jax.Array]:
    """One device's part: its copies through the slot grid, once (capacity) or in rounds (dropless)."""
    experts = gate.shape[0] * shards
    cells = experts * (x.shape[0] // capacity.tokens)
    cell, rank = copy_ranks(chosen, capacity, experts)
    serve = partial(_serve, activation=activation, shards=shards, slots=capacity.slots, cells=cells)
    if not dropless:
        return serve(x, weights, (gate, up, down), cell, rank, 0), dropped_copies(rank, capacity, chosen.shape[1])
    # The rank of the fullest cell's last copy says its rounds; every device of the group runs the most.
    rounds = jnp.max(rank) // capacity.slots + 1
    if shards > 1:
        rounds = jax.lax.pmax(rounds, EXPERT_AXIS)
    return _in_rounds(serve, x, weights, (gate, up, down), cell, rank, rounds), jnp.zeros(chosen.shape[0], jnp.int32)


def _serve(
    x: jax.Array,
    weights: jax.Array,
    mlp: Mlp,
    cell: jax.Array,
    rank: jax.Array,
    round_: jax.Array | int,
    *,
    activation: Callable[[jax.Array], jax.Array],
    shards: int,
    slots: int,
    cells: int,
) -> jax.Array:
    """Round `round_` of the slot grid: the copies of rank [round x slots, (round + 1) x slots) of each cell sent
    to their experts and back, summed per token by their gates (the others add nothing). The grid is the send
    buffer, experts-major, so device s's block is rows [s, s + 1) x (E / S) x groups x slots and a row's place
    names its local expert (nothing else is sent)."""
    local_experts, feature = mlp[0].shape[0], x.shape[-1]
    rows = grid_rows(cell, rank, slots, cells, round_ * slots)
    send = dispatch(x, rows, cells * slots).reshape(shards, local_experts, -1, feature)
    if shards == 1:  # every expert is here: the grid is served where it was packed
        out = swiglu_experts(send.reshape(local_experts, -1, feature), *mlp, activation)
        return combine(out.reshape(cells * slots, feature), rows, weights)
    received = jax.lax.all_to_all(send, EXPERT_AXIS, 0, 0, tiled=True)  # (source, local expert, row, feature)
    by_expert = received.transpose(1, 0, 2, 3).reshape(local_experts, -1, feature)
    out = swiglu_experts(by_expert, *mlp, activation)
    out = out.reshape(local_experts, shards, -1, feature).transpose(1, 0, 2, 3)
    returned = jax.lax.all_to_all(out, EXPERT_AXIS, 0, 0, tiled=True)
    return combine(returned.reshape(cells * slots, feature), rows, weights)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _in_rounds(
    serve: Callable[..., jax.Array],
    x: jax.Array,
    weights: jax.Array,
    mlp: Mlp,
    cell: jax.Array,
    rank: jax.Array,
    rounds: jax.Array,
) -> jax.Array:
    """Every copy served: the sum of `rounds` rounds of `serve`, accumulated in float32."""

    def add_round(round_: jax.Array, total: jax.Array) -> jax.Array:
        return total + serve(x, weights, mlp, cell, rank, round_).astype(jnp.float32)

    return jax.lax.fori_loop(0, rounds, add_round, jnp.zeros(x.shape, jnp.float32)).astype(x.dtype)


def _in_rounds_forward(serve: Callable[..., jax.Array], *inputs: jax.Array | Mlp) -> tuple[jax.Array, tuple]:
    return _in_rounds(serve, *inputs), inputs


def _in_rounds_backward(serve: Callable[..., jax.Array], saved: tuple, d_out: jax.Array) -> tuple:
    """The rounds' gradient, round by round: each round recomputed and pulled back, so the backward pass holds
    one round's buffers at a time, as the forward does."""
    x, weights, mlp, cell, rank, rounds = saved
    differentiable = (x, weights, mlp)

    def add_round(round_: jax.Array, total: tuple) -> tuple:
        _, pull_back = jax.vjp(lambda x, w, m: serve(x, w, m, cell, rank, round_), *differentiable)
        return jax.tree.map(lambda sum_, grad: sum_ + grad.astype(jnp.float32), total, pull_back(d_out))

    zeros = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, jnp.float32), differentiable)
    grads = jax.lax.fori_loop(0, rounds, add_round, zeros)
    return (*jax.tree.map(lambda grad, leaf: grad.astype(leaf.dtype), grads, differentiable), None, None, None)


_in_rounds.defvjp(_in_rounds_forward, _in_rounds_backward)
