"""The MoE language model the train step builds: Levanter's qwen3_moe plus what the hero run used.

Attention, experts, permutation and the LM head are Levanter's `qwen3_moe` classes, subclassed; this module
adds, each an option of `MoeConfig`:

- **Aux-loss-free router-bias balancing** (`router_bias_balancing`). Tokens are routed by the top K of
  router logits + stop_gradient(bias); the gate weights come from the logits alone. With the option on, the
  top K+1 are taken and the (K+1)-th score is the token's threshold; per expert, the (1 - K/E) quantile of
  (logit - threshold) over the batch is the margin by which the expert would have to be lowered so that a
  fraction K/E of tokens (a fair share) clears the threshold; the next step's bias is minus that quantile,
  centred per layer. The bias is never trained by gradients.
- **Shared experts** (`num_shared_experts` SwiGLU MLPs of width `shared_expert_intermediate_dim`, on every
  token, added to the routed output). n SwiGLUs of width w summed are exactly one SwiGLU of width n*w (the
  hidden units concatenate), so they are held as one `LlamaMlp`.
- **Router z-loss** (`router_z_loss_weight`): weight x mean over tokens of logsumexp(router logits)^2,
  summed over layers, added to the training loss.

How the bias reaches the next step inside Levanter's functional trainer: each MoE block holds a
`RouterBalance` (bias, and the tokens each expert received in the last batch) that is a Haliax
`CustomGradientAccumulation`. Levanter's train step takes such modules out of the optimizer's view and
*overwrites* them with their gradient (`haliax.quantization.apply_updates`), which is how its FP8 scaling
state travels. The block adds to the loss a term that is exactly zero in value but whose gradient with
respect to the state is the state's next value (`x * sg(v) - sg(x * v)` has gradient `v`). So:

- the bias and loads are outside AdamW: no weight decay, no moments, no learning rate;
- under gradient accumulation Levanter does not average such modules but folds them with
  `RouterBalance.accumulate`: loads add up, and the bias becomes the mean of the microbatches' estimates
  (each microbatch's quantile is exact for that microbatch; their mean approximates the batch's);
- checkpoints hold them like any other leaf (one eqx tree), so a resumed run keeps its bias;
- a bf16 compute policy casts them like every leaf: the bias and loads then pass through bf16 (about three
  significant digits), enough to route and to log load ratios;
- routing always adds the bias, so a model evaluated with the option off routes as it was trained; the
  option only decides whether the bias is updated (off: its next value is its current value, zero).

The train step's `MoeWatchConfig` keeps these leaves out of Levanter's parameter, gradient and update
norms and logs them apart (`router_figures`). The quantile is an exact sort over the batch's tokens per
expert: cheap here, but at the hero's 46M tokens per step a sharded histogram estimate would replace it.
Capacity is not modelled: routing is dropless (grouped matmuls over every assignment), so there is no
dropped-token fraction to log. In eval (`inference_mode`) the z-loss and the HF load-balancing loss are
left out of the loss, so eval losses are pure cross-entropy. HF export is Qwen3-MoE's and carries neither
shared experts nor the bias: do not export models that use them.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Self

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import haliax.quantization as hq
import jax
import jax.numpy as jnp
import jax.random as jrandom
from haliax import Axis, NamedArray
from haliax.jax_utils import maybe_rng_split, shaped_rng_split
from haliax.nn.scan import BlockSeq, Stacked
from levanter.callbacks.watch import WatchCallback, WatchConfig, compute_watch_stats
from levanter.layers.attention import Attention, AttentionMask
from levanter.models.llama import LlamaEmbedding, LlamaMlp
from levanter.models.lm_model import LmConfig
from levanter.models.qwen3_moe import (
    Qwen3MoeConfig,
    Qwen3MoeDecoderLayer,
    Qwen3MoeExperts,
    Qwen3MoeLMHeadModel,
    Qwen3MoeSparseMoeBlock,
    Qwen3MoeTransformer,
)

logger = logging.getLogger(__name__)

ROUTER_Z_LOSS = "router_z_loss"
LOAD_BALANCING_LOSS = "load_balancing_loss"
STATE_CARRY = "router_state_carry"


@LmConfig.register_subclass("moe_balanced")
@dataclass(frozen=True)
class MoeConfig(Qwen3MoeConfig):
    """Levanter's Qwen3-MoE config with router-bias balancing, shared experts and router z-loss."""

    router_bias_balancing: bool = False
    """Update each layer's router bias by the aux-loss-free rule every step (module docstring)."""
    router_z_loss_weight: float = 0.0
    """Weight of the router z-loss (mean over tokens of logsumexp(router logits)^2, summed over layers)."""
    num_shared_experts: int = 0
    """Shared SwiGLU experts every token passes through."""
    shared_expert_intermediate_dim: int = 0
    """Hidden width of one shared expert."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.router_bias_balancing and self.num_experts_per_tok >= self.num_experts:
            raise ValueError(
                f"router-bias balancing needs top_k < n_experts (got top_k={self.num_experts_per_tok}, "
                f"n_experts={self.num_experts}): with every expert chosen there is no threshold to balance"
            )
        if self.router_z_loss_weight < 0:
            raise ValueError(f"router_z_loss_weight must be >= 0, got {self.router_z_loss_weight}")
        if self.num_shared_experts < 0 or (self.num_shared_experts > 0) != (self.shared_expert_intermediate_dim > 0):
            raise ValueError(
                f"shared experts need num_shared_experts >= 0 and a positive width exactly when there are any "
                f"(got {self.num_shared_experts} of width {self.shared_expert_intermediate_dim})"
            )
        if self.dense_router_gradient:
            raise ValueError("dense_router_gradient is not supported by MoeConfig's routing; leave it off")

    @property
    def shared_mlp_axis(self) -> Axis:
        return Axis(name="shared_mlp", size=self.num_shared_experts * self.shared_expert_intermediate_dim)

    @property
    def model_type(self) -> type[MoeLMHeadModel]:
        return MoeLMHeadModel

    def flops_per_token(self, vocab_size: int, context_length: int) -> float | None:
        routed = super().flops_per_token(vocab_size, context_length)
        if routed is None:
            return None
        # Forward FLOPs, as Levanter counts them: a multiply-add is two FLOPs, a SwiGLU has three matmuls.
        return routed + 2 * 3 * self.hidden_dim * self.shared_mlp_axis.size * self.num_layers

    def total_trainable_params(self, vocab_size: int) -> int:
        return (
            super().total_trainable_params(vocab_size)
            + 3 * self.hidden_dim * self.shared_mlp_axis.size * self.num_layers
        )


class RouterBalance(hq.CustomGradientAccumulation):
    """One layer's router bias and last-batch expert loads: carried by the gradient, never trained."""

    bias: NamedArray
    """Added to the router logits before top-k selection (Experts)."""
    load: NamedArray
    """Token-to-expert assignments of the last batch (Experts)."""
    estimates: NamedArray
    """How many (micro)batch estimates `bias` averages (scalar); the weight for `accumulate`."""

    @staticmethod
    def init(experts: Axis) -> RouterBalance:
        return RouterBalance(hax.zeros(experts), hax.zeros(experts), hax.named(jnp.ones(()), ()))

    def accumulate(self, other: Self) -> Self:
        # `self` is zero on the first microbatch (estimates 0), which makes this the identity then.
        estimates = self.estimates + other.estimates
        bias = (self.bias * self.estimates + other.bias * other.estimates) / estimates
        return dataclasses.replace(self, bias=bias, load=self.load + other.load, estimates=estimates)

    def carry_term(self, bias: NamedArray, load: NamedArray) -> NamedArray:
        """A loss term of value 0 whose gradient with respect to this state is (bias, load, 1)."""

        def carry(leaf: NamedArray, value: NamedArray) -> NamedArray:
            product = hax.sum(leaf * jax.lax.stop_gradient(value))
            return product - jax.lax.stop_gradient(product)

        return carry(self.bias, bias) + carry(self.load, load) + carry(self.estimates, hax.ones_like(self.estimates))


def balanced_bias(logits: jax.Array, threshold: jax.Array, top_k: int) -> jax.Array:
    """The rule: minus the (1 - K/E) quantile over tokens of (logit - threshold) per expert, centred.

    `logits` is (tokens, experts); `threshold` is (tokens,), the (K+1)-th largest biased score."""
    num_experts = logits.shape[-1]
    margin = jnp.quantile(logits - threshold[:, None], 1.0 - top_k / num_experts, axis=0)
    return -(margin - jnp.mean(margin))


class MoeBlock(Qwen3MoeSparseMoeBlock):
    """Qwen3's sparse MoE block with a carried router bias, shared experts and a router z-loss."""

    config: MoeConfig = eqx.field(static=True)
    balance: RouterBalance | None = None
    shared: LlamaMlp | None = None

    @staticmethod
    def init(config: MoeConfig, *, key: jax.Array) -> MoeBlock:
        k_gate, k_experts, k_shared = jrandom.split(key, 3)
        gate = hnn.Linear.init(config.Embed, config.Experts, key=k_gate, use_bias=False)
        activation = config.activation_function.to_fn()
        experts = Qwen3MoeExperts.init(config.Experts, config.Embed, config.MoeMlp, activation, key=k_experts)
        shared = None
        if config.num_shared_experts:
            shared = LlamaMlp.init(config.Embed, config.shared_mlp_axis, activation, key=k_shared)
        return MoeBlock(config, gate, experts, balance=RouterBalance.init(config.Experts), shared=shared)

    def _select(self, logits: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(chosen experts (tokens, K), gate weights (tokens, K), next bias) from f32 logits (tokens, E)."""
        assert self.balance is not None
        top_k = self.config.num_experts_per_tok
        bias = jax.lax.stop_gradient(self.balance.bias.array.astype(jnp.float32))
        scores = jax.lax.stop_gradient(logits) + bias
        if self.config.router_bias_balancing:
            top_scores, chosen = jax.lax.top_k(scores, top_k + 1)
            next_bias = balanced_bias(jax.lax.stop_gradient(logits), top_scores[:, top_k], top_k)
            chosen = chosen[:, :top_k]
        else:
            _, chosen = jax.lax.top_k(scores, top_k)
            next_bias = bias
        weights = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), chosen, axis=-1)
        if self.config.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdims=True)
        return chosen, weights, next_bias

    def __call__(self, x: NamedArray, *, key: jax.Array | None = None) -> tuple[NamedArray, dict[str, NamedArray]]:
        assert self.balance is not None
        config = self.config
        squash_axes = [x.resolve_axis(name) for name in ("batch", config.max_Pos.name) if x.has_axis(name)]
        k_gate, k_experts, k_shared = maybe_rng_split(key, 3)
        x_flat = hax.flatten_axes(x, old_axes=squash_axes, new_axis="token")
        token = x_flat.resolve_axis("token")
        logits = self.gate(x_flat, key=k_gate).astype(jnp.float32).rearrange((token, config.Experts))
        chosen, weights, next_bias = self._select(logits.array)
        load = jnp.bincount(chosen.reshape(-1), length=config.num_experts).astype(jnp.float32)

        topk_idx = hax.named(chosen, (token, config.TopExperts))
        topk_idx_flat = hax.flatten_axes(topk_idx, old_axes=[token, config.TopExperts], new_axis="token_repeat")
        token_repeat = topk_idx_flat.resolve_axis("token_repeat")
        x_repeat_sort, group_sizes, sort_idx = self._permute(x_flat, topk_idx_flat, token_repeat)
        out_repeat_sort = self.experts(x_repeat_sort, group_sizes, key=k_experts)
        out_repeat = self._unpermute(out_repeat_sort, sort_idx, token, config.TopExperts)
        out = out_repeat.dot(hax.named(weights.astype(x.dtype), (token, config.TopExperts)), axis=config.TopExperts)
        if self.shared is not None:
            out = out + self.shared(x_flat, key=k_shared)
        out = hax.unflatten_axis(out, axis=token, new_axes=squash_axes)

        extras = {
            STATE_CARRY: self.balance.carry_term(hax.named(next_bias, config.Experts), hax.named(load, config.Experts))
        }
        if self.inference:
            return out, extras
        if config.router_z_loss_weight:
            log_z = hnn.logsumexp(logits, axis=config.Experts)
            extras[ROUTER_Z_LOSS] = config.router_z_loss_weight * hax.mean(log_z * log_z, axis=token)
        if config.router_aux_loss_coef is not None:
            # HF Qwen3-MoE's load-balancing loss, as Levanter's block computes it.
            fraction = hax.named(load, config.Experts) / token.size
            mean_prob = hax.mean(hnn.softmax(logits, axis=config.Experts), axis=token)
            balance_loss = config.num_experts * hax.sum(fraction * mean_prob, axis=config.Experts)
            extras[LOAD_BALANCING_LOSS] = config.router_aux_loss_coef * balance_loss
        return out, extras


class MoeDecoderLayer(Qwen3MoeDecoderLayer):
    """Qwen3's decoder layer around a `MoeBlock`."""

    config: MoeConfig = eqx.field(static=True)
    mlp: MoeBlock

    @staticmethod
    def init(config: MoeConfig, *, key: jax.Array) -> MoeDecoderLayer:
        k_attn, k_mlp = jrandom.split(key, 2)
        attention = Attention.init(config.attention_config(), key=k_attn)
        mlp = MoeBlock.init(config, key=k_mlp)
        return MoeDecoderLayer(
            config, attention, mlp, config.mk_LayerNorm(config.Embed), config.mk_LayerNorm(config.Embed)
        )


class MoeTransformer(Qwen3MoeTransformer):
    """Qwen3's layer stack; every per-layer loss term is summed over layers."""

    config: MoeConfig = eqx.field(static=True)

    @staticmethod
    def init(config: MoeConfig, *, key: jax.Array) -> MoeTransformer:
        stack = Stacked if config.scan_layers else BlockSeq
        layers = stack.init(config.Layers, MoeDecoderLayer, gradient_checkpointing=config.gradient_checkpointing)(
            config, key=shaped_rng_split(key, config.num_layers)
        )
        return MoeTransformer(config, layers, config.mk_LayerNorm(config.Embed))

    def __call__(
        self,
        x: NamedArray,
        attn_mask: AttentionMask | None,
        *,
        key: jax.Array | None,
        pos_ids: NamedArray | None = None,
    ) -> tuple[NamedArray, dict[str, NamedArray]]:
        keys = maybe_rng_split(key, self.config.num_layers) if key is not None else None
        x, extras = self.layers.scan(x, mask=attn_mask, key=keys, pos_ids=pos_ids)
        return self.norm(x), {name: hax.sum(term, axis=self.config.Layers) for name, term in extras.items()}


class MoeLMHeadModel(Qwen3MoeLMHeadModel):
    """Qwen3's LM head model on a `MoeTransformer`; `activations` returns every loss term's sum as aux loss."""

    transformer: MoeTransformer

    @classmethod
    def init(cls, vocab: Axis, config: MoeConfig, *, key: jax.Array) -> MoeLMHeadModel:
        k_transformer, k_embeddings = jrandom.split(key, 2)
        transformer = MoeTransformer.init(config, key=k_transformer)
        embeddings = LlamaEmbedding.init(vocab, config, key=k_embeddings)
        lm_head = None
        if not config.tie_word_embeddings:
            lm_head = hnn.Linear.init(In=config.Embed, Out=vocab, key=k_embeddings, use_bias=False, out_first=True)
        return MoeLMHeadModel(transformer, embeddings, lm_head)

    def activations(
        self,
        input_ids: NamedArray,
        attn_mask: AttentionMask | None = None,
        *,
        key: jax.Array | None = None,
        pos_ids: NamedArray | None = None,
    ) -> tuple[NamedArray, NamedArray | float]:
        x = self.embeddings.embed(input_ids)
        x, extras = self.transformer(x, attn_mask=attn_mask, key=key, pos_ids=pos_ids)
        return x, sum(extras.values(), start=0.0)


def router_balances(tree: Any) -> list[RouterBalance]:
    """Every `RouterBalance` in a model, gradient or train-state tree, in tree order."""
    leaves = jax.tree.leaves(tree, is_leaf=lambda node: isinstance(node, RouterBalance))
    return [leaf for leaf in leaves if isinstance(leaf, RouterBalance)]


def router_figures(tree: Any) -> dict[str, jax.Array]:
    """Router figures to log from a model (or its gradient: then loads are this step's, bias the next).

    `router/bias/norm` (all layers), and per layer `router/layer_<i>/bias_norm`, `.../load_max_over_min`
    (inf when an expert got no token) and `.../load_max_over_mean`; `router/load/max_over_min` and
    `router/load/max_over_mean` are the worst layer's."""
    balances = router_balances(tree)
    if not balances:
        return {}
    bias = jnp.concatenate([b.bias.array.reshape(-1, b.bias.array.shape[-1]) for b in balances])
    load = jnp.concatenate([b.load.array.reshape(-1, b.load.array.shape[-1]) for b in balances])
    max_over_min = load.max(axis=-1) / load.min(axis=-1)
    max_over_mean = load.max(axis=-1) / load.mean(axis=-1)
    figures = {
        "router/bias/norm": jnp.linalg.norm(bias),
        "router/load/max_over_min": max_over_min.max(),
        "router/load/max_over_mean": max_over_mean.max(),
    }
    for layer in range(bias.shape[0]):
        figures[f"router/layer_{layer}/bias_norm"] = jnp.linalg.norm(bias[layer])
        figures[f"router/layer_{layer}/load_max_over_min"] = max_over_min[layer]
        figures[f"router/layer_{layer}/load_max_over_mean"] = max_over_mean[layer]
    return figures


class MoeWatchCallback(WatchCallback):
    """Levanter's watch (norms of trained weights, gradients, updates) without the router state, plus
    `router_figures` of this step's carried state."""

    def inside_step(self, state: Any, inside_info: Any) -> dict[str, Any]:
        _, params = hq.partition_for_grad_overwrite(state.trainable_model)
        carried, grads = hq.partition_for_grad_overwrite(inside_info.grads)
        _, updates = hq.partition_for_grad_overwrite(inside_info.updates)
        stats = compute_watch_stats(
            watch_targets=self.watch_targets,
            include_norms=self.include_norms,
            include_per_parameter_norms=self.include_per_parameter_norms,
            include_histogram=self.include_histogram,
            split_scan_layers=self.split_scan_layers,
            params=params,
            grads=grads,
            updates=updates,
            opt_state=state.opt_state,
            model_tree_type=type(state.model),
        )
        return {**stats, **router_figures(carried)}


@dataclass(frozen=True)
class MoeWatchConfig(WatchConfig):
    """`TrainerConfig.watch` for MoE runs: builds `MoeWatchCallback`."""

    def build(self) -> MoeWatchCallback:
        return MoeWatchCallback(
            watch_targets=self.watch_targets,
            include_norms=self.include_norms,
            include_per_parameter_norms=self.include_per_parameter_norms,
            include_histogram=self.include_histograms,
            split_scan_layers=self.split_scan_layers,
        )
