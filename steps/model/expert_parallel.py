"""Expert parallelism: routed experts split over the mesh's `expert` axis, tokens sent to them by all-to-all.

On a mesh with an `expert` axis of size S > 1, each device holds `E / S` of a layer's routed experts and its
own slice of the tokens (tokens split over every mesh axis, `data` and `expert`). A device:

1. packs its token copies (one per chosen expert) into a send buffer `[S, rows, feature]`, row block s for
   the experts of device s;
2. exchanges the buffers with one `all_to_all` over `expert` (row block s goes to device s of its group);
3. runs its experts on what it received;
4. sends the outputs back by the reverse `all_to_all`, and sums each token's copies weighted by its gates.

No collective carries the whole token batch: the two all-to-alls move each device's own routed copies
(tests/test_expert_parallel.py reads the compiled HLO). How the send buffer is sized:

- **dropless** (`capacity=None`): every copy it has per destination (C = tokens x K rows each, with the local
  expert of each row sent alongside), the worst case of every copy going to one device: S times the copies;
- **capacity** (`CapacityGroups`, GShard's and Marin's grug `ep_fixed_all_to_all` layout): each expert takes
  at most `slots` copies from each group of `tokens` consecutive tokens (a sequence), the first ones in token
  order; the rest are dropped (no output from that expert). The buffer is the slot grid
  `[experts, groups, slots]`, experts-major, so a destination's rows are one contiguous block and a row's
  place says its expert: `E x groups x slots` rows = capacity factor x the copies, not S x. The same grid
  (`capacity_slots`, `dispatch`, `combine`) serves the layer on one device (steps/model/moe_block.py), so a
  token is dropped on a mesh exactly when it is on one device: a group is a sequence, and a device holds
  whole sequences, whatever the mesh or the microbatch.
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


def capacity_groups(capacity_factor: float, group_tokens: int, top_k: int, experts: int) -> CapacityGroups:
    """An expert's slots per group: `capacity_factor` x its fair share of the group's copies, rounded up."""
    return CapacityGroups(group_tokens, max(1, math.ceil(capacity_factor * group_tokens * top_k / experts)))


def capacity_slots(chosen: jax.Array, capacity: CapacityGroups, experts: int) -> jax.Array:
    """Each copy's row in the slot grid `[experts, groups, slots]` (flattened), for `chosen` (tokens, K): the
    j-th copy (in token order) of a group sent to expert e gets row (e x groups + group) x slots + j while
    j < slots; a dropped copy gets the row one past the grid's end, which `dispatch` and `combine` skip."""
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
    rank = jnp.zeros_like(cell).at[order].set(rank_sorted)
    return jnp.where(rank < capacity.slots, cell * capacity.slots + rank, experts * groups * capacity.slots)


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
    batch's router scores (tokens x experts) onto every device, once per layer. Top-k is per token, so under
    expert parallelism (where tokens are split over the token axes) it runs inside `shard_map` instead."""
    if expert_parallel_size(mesh) == 1:
        return jax.lax.top_k(scores, k)
    assert mesh is not None  # expert_parallel_size is 1 without a mesh
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
    capacity: CapacityGroups | None = None,
) -> jax.Array:
    """The weighted sum over each token's chosen experts of their SwiGLU outputs, experts split over `expert`;
    dropless, or each expert taking at most `capacity.slots` copies of each group (module docstring).

    `x` (tokens, feature), `chosen` and `weights` (tokens, K), `gate_up` = (gate, up) weights (E, feature,
    width), `down` (E, width, feature)."""
    tokens = P(token_axes(mesh))
    experts = P(EXPERT_AXIS)
    run = partial(_local, activation=activation, shards=expert_parallel_size(mesh), capacity=capacity)
    sharded = shard_map(
        run,
        mesh=mesh,
        in_specs=(tokens, tokens, tokens, experts, experts, experts),
        out_specs=tokens,
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
    capacity: CapacityGroups | None,
) -> jax.Array:
    """One device's part: dispatch its copies, run its experts on what arrives, send the outputs back."""
    if capacity is not None:
        return _local_with_capacity(x, chosen, weights, (gate, up, down), activation, shards, capacity)
    local_experts = gate.shape[0]
    copies, feature = chosen.size, x.shape[-1]
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # by expert, hence by destination device
    sorted_experts = flat[order]
    destination = sorted_experts // local_experts
    per_destination = jnp.bincount(destination, length=shards)
    slot = jnp.arange(copies) - (jnp.cumsum(per_destination) - per_destination)[destination]
    send = jnp.zeros((shards, copies, feature), x.dtype).at[destination, slot].set(x[order // chosen.shape[1]])
    # The local expert of each row, `local_experts` marking an empty row (sorted last on arrival).
    send_expert = jnp.full((shards, copies), local_experts, jnp.int32)
    send_expert = send_expert.at[destination, slot].set(sorted_experts % local_experts)
    received = jax.lax.all_to_all(send, EXPERT_AXIS, 0, 0, tiled=True)
    received_expert = jax.lax.all_to_all(send_expert, EXPERT_AXIS, 0, 0, tiled=True).reshape(-1)
    rows = received.reshape(-1, feature)
    by_expert = jnp.argsort(received_expert, stable=True)
    group_sizes = jnp.bincount(received_expert, length=local_experts + 1)[:local_experts].astype(jnp.int32)
    grouped = rows[by_expert]
    hidden = activation(jax.lax.ragged_dot(grouped, gate, group_sizes)) * jax.lax.ragged_dot(grouped, up, group_sizes)
    out_grouped = jax.lax.ragged_dot(hidden, down, group_sizes)
    valid = (received_expert[by_expert] < local_experts)[:, None]
    out_rows = jnp.zeros_like(rows).at[by_expert].set(jnp.where(valid, out_grouped, 0))
    returned = jax.lax.all_to_all(out_rows.reshape(shards, copies, feature), EXPERT_AXIS, 0, 0, tiled=True)
    out_sorted = returned[destination, slot]  # in `order`
    out_copies = jnp.zeros((copies, feature), x.dtype).at[order].set(out_sorted)
    return jnp.einsum("tkf,tk->tf", out_copies.reshape(*chosen.shape, feature), weights.astype(x.dtype))


def _local_with_capacity(
    x: jax.Array,
    chosen: jax.Array,
    weights: jax.Array,
    mlp: tuple[jax.Array, jax.Array, jax.Array],
    activation: Callable[[jax.Array], jax.Array],
    shards: int,
    capacity: CapacityGroups,
) -> jax.Array:
    """One device's part with capacity: its slot grid is the send buffer, expert-major, so device s's block is
    rows [s, s + 1) x (E / S) x groups x slots and a row's place names its local expert (nothing else is sent)."""
    local_experts, feature = mlp[0].shape[0], x.shape[-1]
    experts = local_experts * shards
    slots = capacity_slots(chosen, capacity, experts)
    grid_rows = experts * (x.shape[0] // capacity.tokens) * capacity.slots
    send = dispatch(x, slots, grid_rows).reshape(shards, local_experts, -1, feature)
    received = jax.lax.all_to_all(send, EXPERT_AXIS, 0, 0, tiled=True)  # (source, local expert, row, feature)
    by_expert = received.transpose(1, 0, 2, 3).reshape(local_experts, -1, feature)
    out = swiglu_experts(by_expert, *mlp, activation)
    out = out.reshape(local_experts, shards, -1, feature).transpose(1, 0, 2, 3)
    returned = jax.lax.all_to_all(out, EXPERT_AXIS, 0, 0, tiled=True)
    return combine(returned.reshape(grid_rows, feature), slots, weights)
