"""Expert parallelism: routed experts split over the mesh's `expert` axis, tokens sent to them by all-to-all.

On a mesh with an `expert` axis of size S > 1, each device holds `E / S` of a layer's routed experts and its
own slice of the tokens (tokens split over every mesh axis, `data` and `expert`). A device:

1. sorts its token copies (one per chosen expert) by destination device and packs them into a send buffer
   `[S, C, feature]`, C = every copy it has (so nothing is dropped: the layer computes exactly what the
   single-device layer computes);
2. exchanges the buffers with one `all_to_all` over `expert` (row s goes to device s of its expert group),
   with the local expert of each row;
3. runs its experts on what it received as one grouped matmul (`ragged_dot`, rows sorted by local expert);
4. sends the outputs back by the reverse `all_to_all`, and sums each token's copies weighted by its gates.

No collective carries the whole token batch: the two all-to-alls move each device's own routed copies
(tests/test_expert_parallel.py reads the compiled HLO). The buffers are sized for the worst case (every
copy to one device), S times the copies; a capacity per destination would shrink them, at the price of drops.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jax import shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

EXPERT_AXIS = "expert"


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
) -> jax.Array:
    """The weighted sum over each token's chosen experts of their SwiGLU outputs, experts split over `expert`.

    `x` (tokens, feature), `chosen` and `weights` (tokens, K), `gate_up` = (gate, up) weights (E, feature,
    width), `down` (E, width, feature)."""
    tokens = P(token_axes(mesh))
    experts = P(EXPERT_AXIS)
    run = partial(_local, activation=activation, shards=expert_parallel_size(mesh), experts=down.shape[0])
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
    experts: int,
) -> jax.Array:
    """One device's part: dispatch its copies, run its experts on what arrives, send the outputs back."""
    local_experts = experts // shards
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
