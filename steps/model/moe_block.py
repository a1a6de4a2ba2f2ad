"""The MoE feed-forward of one layer: routing with a carried router bias, routed experts (optionally inside a
latent), shared experts, and the router's loss terms.

Levanter's `Qwen3MoeSparseMoeBlock`, subclassed. What it adds (steps/model/moe_model.py's docstring says why and how
the bias travels through Levanter's trainer):

- routing by the top K of logits + stop_gradient(bias), the gate weights from the logits alone (softmax, or
  the hero's sigmoid renormalised to `router_combine_sum`: `combine_weights`); with balancing on, the top K+1
  are taken and each expert's excess over the (K+1)-th score is counted into the histogram the next bias is
  read from (steps/model/router_balance.py; `RouterBalance` carries it);
- **latent experts** (`expert_latent_dim`): the layer projects each token once, d_model -> latent, routes the
  latent through its experts' SwiGLUs, sums the top-k outputs in the latent, and projects once back,
  latent -> d_model. Both projections are shared by all routed experts of the layer and applied once per
  token (the up-projection is linear, so summing before it is exact and K times cheaper than after). The
  router and the shared experts read d_model;
- shared experts: n SwiGLUs of width w summed are exactly one SwiGLU of width n*w (the hidden units
  concatenate), so they are held as one `LlamaMlp`;
- axis names of their own for the router's output (`router_experts`, renamed `experts` on the logits) and,
  without a latent, the routed experts' d_model (`expert_embed`): the mesh splits `embed` over every device
  and `experts` over `expert` (steps/model/levanter_config.py), so no array may hold both;
- the router z-loss and the HF load-balancing loss as per-layer loss terms.

Dropless on one device, the token permutation is Levanter's (a per-shard sort under `shard_map`, grouped
matmuls), written once here for any feature axis: Levanter's own `_permute`/`_unpermute` are fixed to d_model.
With a `capacity_factor` each expert serves at most capacity factor x its fair share of each sequence's
copies, in training and in evaluation alike (a model is scored as it was trained), in a slot grid shared with
the expert-parallel layer (steps/model/expert_parallel.py), so one device and any mesh or microbatch drop the
same copies. Under expert parallelism a dropless layer serves every copy in rounds of that grid. In
evaluation (`inference_mode`) with a capacity, each token's dropped copies are an extra output
(`DROPPED_COPIES`, (batch, position)), which the model sums over layers (steps/model/moe_model.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import jax.random as jrandom
from haliax import Axis, NamedArray
from haliax.jax_utils import maybe_rng_split
from haliax.partitioning import pspec_for_axis
from jax import shard_map
from levanter.models.llama import LlamaMlp
from levanter.models.qwen3_moe import Qwen3MoeExperts, Qwen3MoeSparseMoeBlock

from steps.model.config import MoeArchitecture
from steps.model.expert_parallel import (
    CapacityGroups,
    capacity_groups,
    capacity_slots,
    combine,
    dispatch,
    expert_parallel_size,
    local_top_k,
    replicated,
    routed_experts,
    shard_tokens,
    splits_tokens,
    swiglu_experts,
    token_axes,
)
from steps.model.model_size import DROPLESS_ROUND_FACTOR
from steps.model.router_balance import RouterBalance, excess_histogram, router_dtype

ROUTER_Z_LOSS = "router_z_loss"
LOAD_BALANCING_LOSS = "load_balancing_loss"
STATE_CARRY = "router_state_carry"
DROPPED_COPIES = "router_dropped_copies"


def combine_weights(logits: jax.Array, chosen: jax.Array, config: MoeArchitecture) -> jax.Array:
    """The weights (tokens, K) of the chosen experts' outputs, from the logits alone (the bias only routes).

    Softmax reads the distribution over all experts at the chosen ones; sigmoid scores each chosen expert on
    its own, so a chosen expert's weight does not depend on the logits of experts it was not sent to. With
    `norm_topk_prob` they are renormalised to sum to `router_combine_sum` (the hero recipe: sigmoid, 2.5)."""
    if config.router_combine == "sigmoid":
        weights = jax.nn.sigmoid(jnp.take_along_axis(logits, chosen, axis=-1))
    else:
        weights = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), chosen, axis=-1)
    if config.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdims=True) * config.router_combine_sum
    return weights


class MoeBlock(Qwen3MoeSparseMoeBlock):
    """Qwen3's sparse MoE block with a carried router bias, optional latent experts, shared experts and a
    router z-loss."""

    config: MoeArchitecture = eqx.field(static=True)
    balance: RouterBalance | None = None
    shared: LlamaMlp | None = None
    latent_in: hnn.Linear | None = None
    """d_model -> latent, shared by the layer's routed experts (None: experts read d_model)."""
    latent_out: hnn.Linear | None = None
    """latent -> d_model, applied once to the gate-weighted sum of the experts' outputs."""

    @staticmethod
    def init(config: MoeArchitecture, *, key: jax.Array) -> MoeBlock:
        k_gate, k_experts, k_shared, k_in, k_out = jrandom.split(key, 5)
        gate = hnn.Linear.init(config.Embed, config.RouterExperts, key=k_gate, use_bias=False)
        activation = config.activation_function.to_fn()
        latent_in = latent_out = None
        if config.expert_latent_dim is not None:
            latent_in = hnn.Linear.init(config.Embed, config.Latent, key=k_in, use_bias=False)
            latent_out = hnn.Linear.init(config.Latent, config.Embed, key=k_out, use_bias=False)
        experts = Qwen3MoeExperts.init(config.Experts, config.ExpertIn, config.MoeMlp, activation, key=k_experts)
        shared = None
        if config.num_shared_experts:
            shared = LlamaMlp.init(config.Embed, config.shared_mlp_axis, activation, key=k_shared)
        balance = RouterBalance.init(config.Experts, config.num_experts_per_tok)
        return MoeBlock(
            config, gate, experts, balance=balance, shared=shared, latent_in=latent_in, latent_out=latent_out
        )

    def _select(self, logits: jax.Array, mesh: Any = None) -> tuple[jax.Array, jax.Array, RouterBalance]:
        """(chosen experts (tokens, K), gate weights (tokens, K), the router state this batch leaves) from
        logits (tokens, E) in at least f32 (`router_dtype`).

        Top-k runs on each device's own tokens and the excess histogram only counts over tokens, so under
        expert parallelism no collective carries the logits (tokens x experts)."""
        assert self.balance is not None
        top_k = self.config.num_experts_per_tok
        bias = jax.lax.stop_gradient(self.balance.routing_bias())
        scores = jax.lax.stop_gradient(logits) + bias.array
        excess = None
        if self.config.router_bias_balancing:
            top_scores, chosen = local_top_k(mesh, scores, top_k + 1)
            excess = excess_histogram(scores - top_scores[:, top_k:])
            chosen = chosen[:, :top_k]
        else:
            _, chosen = local_top_k(mesh, scores, top_k)
        load = jnp.bincount(chosen.reshape(-1), length=self.config.num_experts).astype(jnp.float32)
        return chosen, combine_weights(logits, chosen, self.config), self.balance.counted(bias, load, excess)

    def _permute(
        self, x_flat: NamedArray, topk_idx_flat: NamedArray, token_repeat: Axis
    ) -> tuple[NamedArray, NamedArray, NamedArray]:
        """Each token's copy per chosen expert, sorted by expert; group sizes; the sort order. `x_flat` is
        (token, feature) for any feature axis (d_model or the latent)."""
        feature, experts, top_k = x_flat.axes[-1], self.config.Experts, self.config.num_experts_per_tok

        @partial(
            shard_map,
            mesh=hax.partitioning._get_mesh(),
            in_specs=(pspec_for_axis(x_flat.axes), pspec_for_axis(topk_idx_flat.axes)),
            out_specs=(
                pspec_for_axis((token_repeat, feature)),
                pspec_for_axis((experts,)),
                pspec_for_axis((token_repeat,)),
            ),
            check_vma=False,
        )
        def permute_sharded(x: jax.Array, topk_idx: jax.Array) -> Any:
            sort_idx = jnp.argsort(topk_idx, axis=-1)
            return jnp.take(x, sort_idx // top_k, axis=0), jnp.bincount(topk_idx, length=experts.size), sort_idx

        with jax.named_scope("permute"):
            x_sorted, group_sizes, sort_idx = permute_sharded(x_flat.array, topk_idx_flat.array)
        return (
            hax.named(x_sorted, (token_repeat, feature)),
            hax.named(group_sizes, (experts,)),
            hax.named(sort_idx, (token_repeat,)),
        )

    def _unpermute(
        self, out_repeat_sort: NamedArray, sort_idx: NamedArray, token: Axis, top_experts: Axis
    ) -> NamedArray:
        """The experts' outputs back in token order, (token, top_experts, feature)."""
        feature = out_repeat_sort.axes[-1]

        @partial(
            shard_map,
            mesh=hax.partitioning._get_mesh(),
            in_specs=(pspec_for_axis(out_repeat_sort.axes), pspec_for_axis(sort_idx.axes)),
            out_specs=pspec_for_axis((token, top_experts, feature)),
            check_vma=False,
        )
        def unpermute_sharded(out_sorted: jax.Array, sort_order: jax.Array) -> jax.Array:
            out = jnp.take(out_sorted, jnp.argsort(sort_order), axis=0)
            return jnp.reshape(out, (-1, top_experts.size, feature.size))

        with jax.named_scope("unpermute"):
            return hax.named(unpermute_sharded(out_repeat_sort.array, sort_idx.array), (token, top_experts, feature))

    def __call__(self, x: NamedArray, *, key: jax.Array | None = None) -> tuple[NamedArray, dict[str, NamedArray]]:
        mesh = hax.partitioning._get_mesh()
        if self._tokens_split(mesh):
            # Haliax's layers constrain their outputs by the axis mapping: the flattened tokens must follow the
            # batch's split (unmapped, every Linear on them would gather the batch), and the router's logits
            # must not follow the routed experts' split.
            mapping = {**(hax.partitioning.current_thread_local_mapping() or {}), "token": token_axes(mesh)}
            with hax.axis_mapping({**mapping, self.config.Experts.name: None}):
                return self._router_replicated(mesh)._forward(x, mesh, key)
        return self._forward(x, mesh, key)

    def _tokens_split(self, mesh: Any) -> bool:
        """Whether each device routes and serves its own tokens: under expert parallelism, and in an evaluation with
        a capacity on any mesh that splits tokens (`splits_tokens`), where a slot grid built for the whole batch on
        every device would cost the global batch's copies per device (every expert is local then: no all-to-all).

        A train step on such a mesh keeps the whole batch's grid, which the memory plan prices (0.86 of the
        compiled bytes at data 4, benchmarks/bench_plan_memory.py): serving it per device sums in another order,
        and a train step's numbers must not move under its hash (the tiny hero's two-device rungs moved its
        landing from +0.43% to +1.28% of its prediction, past its band's edge). A dropless layer without expert
        parallelism keeps Levanter's per-shard sort and grouped matmul."""
        if expert_parallel_size(mesh) > 1:
            return True
        return self.inference and self.config.capacity_factor is not None and splits_tokens(mesh)

    def _router_replicated(self, mesh: Any) -> MoeBlock:
        """This block with its router weight (stored split on d_model over every device) and its router state
        (split over `expert`) whole on every device: from either split XLA could all-reduce partial logits or gather
        every token for expert-split ones. Both are small (d_model x experts, experts x bins); the tokens are not."""
        assert self.balance is not None

        def whole(leaf: NamedArray) -> NamedArray:
            return hax.named(replicated(mesh, leaf.array), leaf.axes)

        block = eqx.tree_at(lambda b: b.gate.weight, self, whole(self.gate.weight))
        return eqx.tree_at(lambda b: b.balance, block, jax.tree.map(whole, self.balance, is_leaf=hax.is_named_array))

    def _forward(self, x: NamedArray, mesh: Any, key: jax.Array | None) -> tuple[NamedArray, dict[str, NamedArray]]:
        assert self.balance is not None
        config = self.config
        squash_axes = [x.resolve_axis(name) for name in ("batch", config.max_Pos.name) if x.has_axis(name)]
        k_gate, k_experts, k_shared, k_in, k_out = maybe_rng_split(key, 5)
        x_flat = hax.flatten_axes(x, old_axes=squash_axes, new_axis="token")
        split = self._tokens_split(mesh)
        if split:
            x_flat = hax.named(shard_tokens(mesh, x_flat.array), x_flat.axes)
        token = x_flat.resolve_axis("token")
        logits = self.gate(x_flat, key=k_gate)
        logits = logits.astype(router_dtype(logits.dtype)).rename({config.RouterExperts: config.Experts})
        logits = logits.rearrange((token, config.Experts))
        chosen, weights, carried = self._select(logits.array, mesh if split else None)

        if self.latent_in is None:  # the experts read d_model under their own axis name (`ExpertIn`)
            x_experts = x_flat.rename({config.Embed: config.ExpertIn})
        else:
            x_experts = self.latent_in(x_flat, key=k_in)
        x_experts = x_experts.rearrange((token, config.ExpertIn))
        grid, dropless = self._slot_grid(x, token), config.capacity_factor is None
        dropped = None
        if split:  # each device's own slot grid, sized by its own sequences
            out, dropped = self._expert_parallel(mesh, x_experts, chosen, weights, grid, dropless)
        elif not dropless:
            out, dropped = self._experts_with_capacity(x_experts, chosen, weights, grid)
        else:
            out = self._routed_on_every_device(x_experts, chosen, weights, token, k_experts)
        if self.latent_out is None:
            out = out.rename({config.ExpertIn: config.Embed})
        else:
            out = self.latent_out(out, key=k_out)
        if self.shared is not None:
            out = out + self.shared(x_flat, key=k_shared)
        out = hax.unflatten_axis(out, axis=token, new_axes=squash_axes)

        extras = {STATE_CARRY: self.balance.carry_term(carried)}
        if self.inference:
            if not dropless:
                assert dropped is not None
                extras[DROPPED_COPIES] = hax.unflatten_axis(hax.named(dropped, token), token, squash_axes)
            return out, extras
        return out, {**extras, **self._loss_terms(logits, carried.load.array, token)}

    def _slot_grid(self, x: NamedArray, token: Axis) -> CapacityGroups:
        """The slot grid: the expert capacity with `capacity_factor`, or the grid a dropless expert-parallel
        layer serves its copies through in rounds (`DROPLESS_ROUND_FACTOR`). Counted per sequence, so what is
        dropped never depends on the mesh or the microbatch."""
        config = self.config
        factor = DROPLESS_ROUND_FACTOR if config.capacity_factor is None else config.capacity_factor
        group = x.resolve_axis(config.max_Pos.name).size if x.has_axis(config.max_Pos.name) else token.size
        return capacity_groups(factor, group, config.num_experts_per_tok, config.num_experts)

    def _expert_weights(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The routed experts' (gate, up, down) weights as (experts, in, out) arrays."""
        mlp = self.experts
        gate, up, down = (
            proj.weight.rearrange((self.config.Experts, proj.In, proj.Out)).array
            for proj in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        return gate, up, down

    def _expert_parallel(
        self,
        mesh: Any,
        x_experts: NamedArray,
        chosen: jax.Array,
        weights: jax.Array,
        grid: CapacityGroups,
        dropless: bool,
    ) -> tuple[NamedArray, jax.Array]:
        """The routed experts split over the mesh's `expert` axis (steps/model/expert_parallel.py), and each
        token's dropped copies."""
        gate, up, down = self._expert_weights()
        out, dropped = routed_experts(
            mesh, x_experts.array, chosen, weights, (gate, up), down, self.experts.act, grid, dropless
        )
        return hax.named(out, x_experts.axes).rearrange((x_experts.axes[0], self.config.ExpertIn)), dropped

    def _routed_on_every_device(
        self, x_experts: NamedArray, chosen: jax.Array, weights: jax.Array, token: Axis, key: jax.Array | None
    ) -> NamedArray:
        """The routed experts where each device holds them all, dropless: permute, grouped matmul, unpermute."""
        config = self.config
        topk_idx = hax.named(chosen, (token, config.TopExperts))
        topk_idx_flat = hax.flatten_axes(topk_idx, old_axes=[token, config.TopExperts], new_axis="token_repeat")
        token_repeat = topk_idx_flat.resolve_axis("token_repeat")
        x_repeat_sort, group_sizes, sort_idx = self._permute(x_experts, topk_idx_flat, token_repeat)
        out_repeat_sort = self.experts(x_repeat_sort, group_sizes, key=key)
        out_repeat_sort = out_repeat_sort.rearrange((token_repeat, config.ExpertIn))
        out_repeat = self._unpermute(out_repeat_sort, sort_idx, token, config.TopExperts)
        return out_repeat.dot(
            hax.named(weights.astype(x_experts.dtype), (token, config.TopExperts)), axis=config.TopExperts
        )

    def _experts_with_capacity(
        self, x_experts: NamedArray, chosen: jax.Array, weights: jax.Array, capacity: CapacityGroups
    ) -> tuple[NamedArray, jax.Array]:
        """The routed experts where each device holds them all, with capacity, Switch-style: each expert serves
        the first `capacity.slots` copies of each sequence that chose it, in a slot grid (experts, groups, slots)
        run as one batched dense matmul; the others are dropped and get a zero output. The same grid as the
        expert-parallel layer's (steps/model/expert_parallel.py), so both drop the same copies. Also each
        token's dropped copies."""
        experts, feature = self.config.num_experts, x_experts.axes[-1].size
        slots, dropped = capacity_slots(chosen, capacity, experts)
        rows = dispatch(x_experts.array, slots, experts * (chosen.shape[0] // capacity.tokens) * capacity.slots)
        gate, up, down = self._expert_weights()
        out = swiglu_experts(rows.reshape(experts, -1, feature), gate, up, down, self.experts.act)
        return hax.named(combine(out.reshape(-1, feature), slots, weights), x_experts.axes), dropped

    def _loss_terms(self, logits: NamedArray, load: jax.Array, token: Axis) -> dict[str, NamedArray]:
        """The router z-loss and HF Qwen3-MoE's load-balancing loss (as Levanter's block computes it), when on."""
        config = self.config
        terms = {}
        if config.router_z_loss_weight:
            log_z = hnn.logsumexp(logits, axis=config.Experts)
            terms[ROUTER_Z_LOSS] = config.router_z_loss_weight * hax.mean(log_z * log_z, axis=token)
        if config.router_aux_loss_coef is not None:
            fraction = hax.named(load, config.Experts) / token.size
            mean_prob = hax.mean(hnn.softmax(logits, axis=config.Experts), axis=token)
            balance_loss = config.num_experts * hax.sum(fraction * mean_prob, axis=config.Experts)
            terms[LOAD_BALANCING_LOSS] = config.router_aux_loss_coef * balance_loss
        return terms
