"""The MoE language model the train step builds: Levanter's qwen3_moe plus what the hero run used.

Attention, experts and the LM head are Levanter's `qwen3_moe` classes, subclassed (its token permutation is
rewritten for any feature axis, the latent included); this module and its two parts add, each an option of
`MoeConfig`:

- **Local and global attention layers** (`sliding_window`, `global_every`, `num_kv_heads_local`;
  steps/model/moe_layers.py): every `global_every`-th layer and the last attend over the whole sequence with
  `num_kv_heads` KV heads, the others within a causal window of `sliding_window` positions with
  `num_kv_heads_local` KV heads, through Levanter's own `AttentionConfig.sliding_window` and attention
  kernels. Qwen3-MoE's inherited `use_sliding_window` / `max_window_layers` only travel to and from HF
  configs (Levanter's qwen3_moe model ignores them, and so does this one).
- **Latent experts** (`expert_latent_dim`; steps/model/moe_block.py): a layer's routed experts work inside a
  latent, between a d_model -> latent and a latent -> d_model projection shared by all of them.
- **Aux-loss-free router-bias balancing** (`router_bias_balancing`; steps/model/router_balance.py). Tokens are
  routed by the top K of router logits + stop_gradient(bias); the gate weights come from the logits alone.
  With the option on, the top K+1 are taken and the (K+1)-th score is the token's threshold; per expert, the
  (1 - K/E) quantile over the batch of (biased score - threshold) is how far the expert would have to be
  lowered so that a fraction K/E of tokens (a fair share) clears the threshold; the next step's bias is the
  bias minus that quantile, centred per layer. The quantile is read from a histogram of the whole batch,
  which adds up over microbatches and devices, so the microbatch size does not change what a step trains.
  The bias is never trained by gradients.
- **Shared experts** (`num_shared_experts` SwiGLU MLPs of width `shared_expert_intermediate_dim` on
  d_model, on every token, added to the routed output).
- **Router z-loss** (`router_z_loss_weight`): weight x mean over tokens of logsumexp(router logits)^2,
  summed over layers, added to the training loss.

QK-norm is off by default (Qwen3 has it on): steps/model/model_size.py, the calculator every plan and MFU figure
comes from, counts no such weights, and the model holds exactly the weights it counts
(`total_trainable_params` is the calculator's figure).

How the bias reaches the next step inside Levanter's functional trainer: each MoE block holds a
`RouterBalance` (the bias the last batch was routed by, that batch's excess histogram and the tokens each
expert received) that is a Haliax `CustomGradientAccumulation`. Levanter's train step takes such modules out of
the optimizer's view and *overwrites* them with their gradient (`haliax.quantization.apply_updates`), which is
how its FP8 scaling state travels. The block adds to the loss a term that is exactly zero in value but whose
gradient with respect to the state is the state's next value (`x * sg(v) - sg(x * v)` has gradient `v`). So:

- the bias, histogram and loads are outside AdamW: no weight decay, no moments, no learning rate;
- under gradient accumulation Levanter does not average such modules but folds them with
  `RouterBalance.accumulate`: histograms and loads add up and the bias (the same in every microbatch) is
  kept, so the next bias is read from the whole batch's histogram, exactly as without microbatches;
- the next step (or an evaluation) routes by `RouterBalance.routing_bias()`, the update applied to the carried
  state, so it needs no finishing pass after the fold;
- checkpoints hold them like any other leaf (one eqx tree), so a resumed run keeps its bias;
- the train step's precision policy (`RouterStatePolicy`) keeps them in f32 under bf16 compute: counts stay
  exact, and the bias as precise as the logits it is added to;
- routing always adds the bias, so a model evaluated with the option off routes as it was trained; the
  option only decides whether the bias is updated (off: nothing is counted, the bias stays as it is, zero).

The train step's `MoeWatchConfig` keeps these leaves out of Levanter's parameter, gradient and update
norms and logs them apart (`router_figures`, layers numbered in depth order). Counting a histogram, rather
than sorting, also keeps the logits where they are: with tokens sharded across data-parallel devices a sort
moves every logit (an all-to-all), where a histogram all-reduces E x 257 masses per layer.
Routing is dropless (grouped matmuls over every assignment; under expert parallelism, rounds of a slot grid)
unless the config sets `capacity_factor` (the hero's 1.15; steps/model/moe_block.py): then each expert serves
a capped number of tokens per sequence as one batched matmul (under expert parallelism too), in training and
in eval alike, and `router/dropped_fraction` is logged; in eval `dropped_copies` counts them per position, and
`with_capacity_factor` gives the same weights without the cap (the evaluate step scores both). In eval
(`inference_mode`) the z-loss and the HF load-balancing loss are left out of the loss, so eval losses are pure
cross-entropy.
Levanter's inherited Qwen3-MoE HF converter would drop most of the above: steps/model/hf_export.py writes (and
loads back) the whole model instead, and the train step uses it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import haliax.nn as hnn
import haliax.quantization as hq
import jax
import jax.numpy as jnp
import jax.random as jrandom
from haliax import Axis, NamedArray
from levanter.callbacks.watch import WatchCallback, WatchConfig, compute_watch_stats
from levanter.layers.attention import AttentionMask
from levanter.models.llama import LlamaEmbedding
from levanter.models.lm_model import LmConfig
from levanter.models.qwen3_moe import Qwen3MoeLMHeadModel
from levanter.utils.jax_utils import zeros_like_tree
from levanter.utils.tree_utils import inference_mode

from steps.model.config import MoeArchitecture
from steps.model.moe_block import DROPPED_COPIES
from steps.model.moe_layers import MoeTransformer
from steps.model.router_balance import RouterBalance

logger = logging.getLogger(__name__)


@LmConfig.register_subclass("moe_balanced")
@dataclass(frozen=True)
class MoeConfig(MoeArchitecture):
    """`MoeArchitecture` as a Levanter model config: it builds `MoeLMHeadModel`."""

    @property
    def model_type(self) -> type[MoeLMHeadModel]:
        return MoeLMHeadModel


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
        x, extras = self.transformer(self.embeddings.embed(input_ids), attn_mask=attn_mask, key=key, pos_ids=pos_ids)
        return x, sum((term for name, term in extras.items() if name != DROPPED_COPIES), start=0.0)

    def dropped_copies(self, input_ids: NamedArray, attn_mask: AttentionMask | None = None) -> NamedArray | None:
        """Each position's token copies past their expert's capacity, summed over layers, (batch, position), in
        `inference_mode` with a `capacity_factor` (None otherwise): what the evaluate step's dropped fraction
        counts. The layers' forward pass without the LM head."""
        _, extras = self.transformer(self.embeddings.embed(input_ids), attn_mask=attn_mask, key=None)
        return extras.get(DROPPED_COPIES)


def dropped_share(model: MoeLMHeadModel, batch: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per position of an `LmExample`, the share of its token's expert assignments (K per MoE layer) dropped past
    capacity, as the "loss" Levanter's `TaggedEvaluator` averages (its `LossFnOutput`): weight 1 on every
    position of a scored sequence (the last one too: it is routed like the others), 0 on the all-zero sequences
    that pad a last batch. The evaluate step and the train step's periodic evals report its mean."""
    model = inference_mode(model, True)
    dropped = model.dropped_copies(batch.tokens, batch.attn_mask)
    assert dropped is not None, "only a model with a capacity_factor drops copies"
    config = model.transformer.config
    share = dropped.rearrange(batch.tokens.axes).array / (config.num_experts_per_tok * config.num_layers)
    scored = jnp.sum(batch.loss_weight.array, axis=-1, keepdims=True) > 0
    return share, jnp.broadcast_to(scored, share.shape).astype(share.dtype), batch.tokens.array


def with_capacity_factor(model: MoeLMHeadModel, capacity_factor: float | None) -> MoeLMHeadModel:
    """`model`'s weights under its config with another `capacity_factor` (None: dropless), e.g. to score a model
    trained with a capacity both ways. The factor is a static field of every layer, so the tree is rebuilt from
    the new config's (equal but for that field) around the same leaves."""
    config = dataclasses.replace(model.transformer.config, capacity_factor=capacity_factor)
    assert isinstance(config, MoeConfig)
    template = eqx.filter_eval_shape(config.build, model.Vocab, key=jrandom.PRNGKey(0))
    return jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(model))


def router_balances(tree: Any) -> list[RouterBalance]:
    """Every layer's `RouterBalance` in a model or gradient tree, first layer to last."""
    transformers = jax.tree.leaves(tree, is_leaf=lambda node: isinstance(node, MoeTransformer))
    layers = [layer for node in transformers if isinstance(node, MoeTransformer) for layer in node.layers_in_order()]
    return [layer.mlp.balance for layer in layers if layer.mlp.balance is not None]


def router_figures(tree: Any) -> dict[str, jax.Array]:
    """Router figures to log from a model (or its gradient: then loads are this step's), with the bias the next
    step routes by (`RouterBalance.routing_bias`).

    `router/bias/norm` (all layers), and per layer `router/layer_<i>/bias_norm`, `.../load_max_over_min`
    (inf when an expert got no token) and `.../load_max_over_mean`; `router/load/max_over_min` and
    `router/load/max_over_mean` are the worst layer's. With an expert capacity, `router/dropped_fraction`
    (worst layer; per layer `.../dropped_fraction`): the share of token assignments past their expert's
    capacity, from the step's loads summed over its sequences: exact for one sequence, a lower bound over
    more (capacity applies per sequence, and one sequence cannot use the slots another left empty)."""
    balances = router_balances(tree)
    if not balances:
        return {}
    bias = jnp.stack([balance.routing_bias().array for balance in balances])
    load = jnp.stack([balance.load.array for balance in balances])
    max_over_min = load.max(axis=-1) / load.min(axis=-1)
    max_over_mean = load.max(axis=-1) / load.mean(axis=-1)
    figures = {
        "router/bias/norm": jnp.linalg.norm(bias),
        "router/load/max_over_min": max_over_min.max(),
        "router/load/max_over_mean": max_over_mean.max(),
    }
    dropped = _dropped_fraction(load, _capacity_factor(tree))
    if dropped is not None:
        figures["router/dropped_fraction"] = dropped.max()
    for layer in range(bias.shape[0]):
        figures[f"router/layer_{layer}/bias_norm"] = jnp.linalg.norm(bias[layer])
        figures[f"router/layer_{layer}/load_max_over_min"] = max_over_min[layer]
        figures[f"router/layer_{layer}/load_max_over_mean"] = max_over_mean[layer]
        if dropped is not None:
            figures[f"router/layer_{layer}/dropped_fraction"] = dropped[layer]
    return figures


def _capacity_factor(tree: Any) -> float | None:
    transformers = jax.tree.leaves(tree, is_leaf=lambda node: isinstance(node, MoeTransformer))
    configs = [node.config for node in transformers if isinstance(node, MoeTransformer)]
    return configs[0].capacity_factor if configs else None


def _dropped_fraction(load: jax.Array, capacity_factor: float | None) -> jax.Array | None:
    """Per layer, the share of the (layers, experts) `load`'s assignments past ceil(factor x fair share)."""
    if capacity_factor is None:
        return None
    assigned = load.sum(axis=-1, keepdims=True)
    capacity = jnp.ceil(capacity_factor * assigned / load.shape[-1])
    return jnp.maximum(load - capacity, 0).sum(axis=-1) / jnp.maximum(assigned[:, 0], 1)


class MoeWatchCallback(WatchCallback):
    """Levanter's watch (norms of trained weights, gradients, updates) without the router state, plus
    `router_figures` of this step's carried state. With `log_interval` the callback is registered for every step and
    computes (under a `lax.cond`) and logs its figures only every `log_interval` steps: see `MoeWatchConfig`."""

    def __init__(self, *, log_interval: int | None = None, **watch: Any):
        super().__init__(**watch)
        self.log_interval = log_interval

    def inside_step(self, state: Any, inside_info: Any) -> dict[str, Any]:
        if self.log_interval is None:
            return self._figures(state, inside_info)
        shape = eqx.filter_eval_shape(self._figures, state, inside_info)
        return jax.lax.cond(
            (state.step + 1) % self.log_interval == 0,
            lambda: self._figures(state, inside_info),
            lambda: zeros_like_tree(shape),
        )

    def on_step(self, step_info: Any, cb_info: dict[str, Any]) -> None:
        if self.log_interval is None or step_info.next_step % self.log_interval == 0:
            super().on_step(step_info, cb_info)

    def _figures(self, state: Any, inside_info: Any) -> dict[str, Any]:
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
    """`TrainerConfig.watch` for MoE runs: builds `MoeWatchCallback`.

    Levanter registers the watch every `interval` steps and so compiles two train steps, one with the hook and one
    without (the hook costs a little every step it is compiled into). `compile_once(n)` logs every n steps from a
    single train step instead: the hook is in every step, its figures computed only every n-th. That saves a whole
    compile (~10 s of a tiny CPU run's 60) and suits short runs, where compiling dominates."""

    log_interval: int | None = None
    """Set by `compile_once`: log every this many steps while Levanter sees `interval` 1."""

    @classmethod
    def compile_once(cls, every: int) -> MoeWatchConfig:
        return cls(interval=1, log_interval=every)

    def build(self) -> MoeWatchCallback:
        return MoeWatchCallback(
            log_interval=self.log_interval,
            watch_targets=self.watch_targets,
            include_norms=self.include_norms,
            include_per_parameter_norms=self.include_per_parameter_norms,
            include_histogram=self.include_histograms,
            split_scan_layers=self.split_scan_layers,
        )
