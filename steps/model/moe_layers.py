"""The layer stack of the MoE model: local (sliding-window) and global attention layers, scanned by period.

Layer `i` (0-based) is global when `(i + 1) % global_every == 0` or it is the last layer; the others are
local: they attend within `sliding_window` positions (Levanter's `AttentionConfig.sliding_window`, which
narrows the causal `AttentionMask` the model is called with) and have `num_kv_heads_local` KV heads. Without
a window every layer is global. This is steps/model/model_size.py's `MoeShape.is_global`, the calculator's rule.

Local and global layers hold differently shaped K/V projections, so one `Stacked` cannot hold them all. The
pattern repeats every `global_every` layers, so the stack is a `Stacked` of **periods**, each a `Stacked` of
`global_every - 1` local layers followed by one global layer, plus a shorter **tail** period when the layer
count is not a multiple (22 layers, every 4th global: five periods, then one local and the last, global).
The compiled graph holds one period and the tail, whatever the depth (the hero's 48 layers are one scan over
12 periods), and a checkpoint is one eqx tree like any other. Without a window the period is one global
layer, so an all-global model is a plain scan over its layers.

Levanter's GPU default kernel (NVTE) ignores sliding windows, so local layers run its JAX flash attention on
GPUs (`windowed_backend`); global layers keep the configured kernel.

Rematerialisation follows `MoeArchitecture.remat`, one unit at a time so that nothing is recomputed twice:
"layer" checkpoints the local stack per layer (haliax's policy: each layer's input is kept) and wraps each global
layer in `jax.checkpoint`; "period" checkpoints the stack of periods (and the tail) as units of `global_every`
layers; "none" keeps everything. steps/train/parallelism.py prices exactly these units.

`MoeTransformer.layers_in_order` unstacks the tree (a model, or a gradient of one) into its layers in depth
order, which is how the router figures name layers.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.random as jrandom
from haliax import Axis, NamedArray
from haliax.jax_utils import maybe_rng_split, shaped_rng_split
from haliax.nn.scan import BlockSeq, ScanCheckpointPolicy, Stacked
from levanter.layers.attention import Attention, AttentionBackend, AttentionMask, default_attention_type
from levanter.models.qwen3_moe import Qwen3MoeDecoderLayer

from steps.model.config import MoeArchitecture
from steps.model.moe_block import MoeBlock

Extras = dict[str, NamedArray]


class MoeDecoderLayer(Qwen3MoeDecoderLayer):
    """Qwen3's decoder layer around a `MoeBlock`, with local or global attention."""

    config: MoeArchitecture = eqx.field(static=True)
    mlp: MoeBlock

    @staticmethod
    def init(config: MoeArchitecture, is_global: bool, *, key: jax.Array) -> MoeDecoderLayer:
        k_attn, k_mlp = jrandom.split(key, 2)
        attention_config = config.attention_config()
        if not is_global:
            attention_config = dataclasses.replace(
                attention_config,
                num_kv_heads=config.local_kv_heads,
                sliding_window=config.sliding_window,
                attn_backend=windowed_backend(attention_config.attn_backend),
            )
        attention = Attention.init(attention_config, key=k_attn)
        mlp = MoeBlock.init(config, key=k_mlp)
        return MoeDecoderLayer(
            config, attention, mlp, config.mk_LayerNorm(config.Embed), config.mk_LayerNorm(config.Embed)
        )


def windowed_backend(backend: AttentionBackend | None) -> AttentionBackend | None:
    """The attention backend for a local layer: Levanter's NVTE kernel (Transformer Engine, its default on
    GPUs) hands Transformer Engine a plain causal mask and drops the window, so local layers use Levanter's
    JAX flash attention there instead; its TPU splash kernel and its JAX flash kernel honour the window."""
    resolved = default_attention_type() if backend in (None, AttentionBackend.DEFAULT) else backend
    return AttentionBackend.JAX_FLASH if resolved == AttentionBackend.NVTE else backend


def _stack(config: MoeArchitecture) -> type[Stacked] | type[BlockSeq]:
    return Stacked if config.scan_layers else BlockSeq


def _scan(
    stack: Stacked | BlockSeq,
    x: NamedArray,
    mask: AttentionMask | None,
    key: jax.Array | None,
    pos_ids: NamedArray | None,
) -> tuple[NamedArray, Extras]:
    """Run a stack of layers; its layers' loss terms summed over the stack."""
    keys = maybe_rng_split(key, stack.Block.size) if key is not None else None
    x, stacked = stack.scan(x, mask=mask, key=keys, pos_ids=pos_ids)
    return x, {name: hax.sum(term, axis=stack.Block) for name, term in stacked.items()}


def _call(
    remat: bool,
    unit: MoeDecoderLayer | MoePeriod,
    x: NamedArray,
    mask: AttentionMask | None,
    key: jax.Array | None,
    pos_ids: NamedArray | None,
) -> tuple[NamedArray, Extras]:
    """`unit(x, ...)`, under `jax.checkpoint` when `remat`: only its input is kept for the backward pass."""

    def run(unit: MoeDecoderLayer | MoePeriod, x: NamedArray) -> tuple[NamedArray, Extras]:
        return unit(x, mask, key=key, pos_ids=pos_ids)

    return eqx.filter_checkpoint(run)(unit, x) if remat else run(unit, x)


def _add(extras: Extras, more: Extras) -> Extras:
    return {name: term + more.get(name, 0.0) for name, term in extras.items()}


class MoePeriod(eqx.Module):
    """`local` layers (none when the period is one layer) followed by one global layer."""

    local: Stacked[MoeDecoderLayer] | BlockSeq[MoeDecoderLayer] | None
    global_layer: MoeDecoderLayer

    @staticmethod
    def init(config: MoeArchitecture, num_local: int, *, key: jax.Array) -> MoePeriod:
        k_local, k_global = jrandom.split(key, 2)
        local = None
        if num_local:
            stack = _stack(config).init(
                Axis("local_layers", num_local),
                MoeDecoderLayer,
                gradient_checkpointing=_checkpointing(config.remat == "layer", num_local),
            )
            local = stack(config, False, key=shaped_rng_split(k_local, num_local))
        return MoePeriod(local, MoeDecoderLayer.init(config, True, key=k_global))

    def __call__(
        self, x: NamedArray, mask: AttentionMask | None, *, key: jax.Array | None, pos_ids: NamedArray | None
    ) -> tuple[NamedArray, Extras]:
        k_local, k_global = maybe_rng_split(key, 2)
        local_extras: Extras = {}
        if self.local is not None:
            x, local_extras = _scan(self.local, x, mask, k_local, pos_ids)
        x, extras = _call(self.global_layer.config.remat == "layer", self.global_layer, x, mask, k_global, pos_ids)
        return x, _add(extras, local_extras)

    def layers_in_order(self) -> list[MoeDecoderLayer]:
        local = list(self.local.unstacked()) if self.local is not None else []
        return [*local, self.global_layer]


def _checkpointing(remat: bool, length: int) -> bool | ScanCheckpointPolicy:
    """A stack's checkpoint policy: haliax's (each unit's input kept, the rest recomputed). A scan of one unit is
    unrolled by XLA, which then merges the recomputation with the forward pass it repeats (haliax lets XLA do so
    inside a scan: `prevent_cse=False`) and keeps every residual: one period and a tail held 1.3-1.5x the memory
    priced (benchmarks/bench_plan_memory.py's period-remat probes). A stack of one keeps the recomputation apart."""
    if remat and length == 1:
        return ScanCheckpointPolicy(prevent_cse=True)
    return remat


class MoeTransformer(eqx.Module):
    """The layer stack: `periods` (a stack of full periods) then `tail` (a shorter period), then the final
    norm. Every per-layer loss term is summed over layers."""

    config: MoeArchitecture = eqx.field(static=True)
    periods: Stacked[MoePeriod] | BlockSeq[MoePeriod] | None
    tail: MoePeriod | None
    norm: hnn.RmsNorm

    @staticmethod
    def init(config: MoeArchitecture, *, key: jax.Array) -> MoeTransformer:
        period = config.layers_per_period
        num_periods, tail_layers = divmod(config.num_layers, period)
        k_periods, k_tail = jrandom.split(key, 2)
        periods = tail = None
        if num_periods:
            periods = _stack(config).init(
                Axis("periods", num_periods),
                MoePeriod,
                gradient_checkpointing=_checkpointing(config.remat == "period", num_periods),
            )(config, period - 1, key=shaped_rng_split(k_periods, num_periods))
        if tail_layers:
            tail = MoePeriod.init(config, tail_layers - 1, key=k_tail)
        return MoeTransformer(config, periods, tail, config.mk_LayerNorm(config.Embed))

    def __call__(
        self,
        x: NamedArray,
        attn_mask: AttentionMask | None,
        *,
        key: jax.Array | None,
        pos_ids: NamedArray | None = None,
    ) -> tuple[NamedArray, Extras]:
        k_periods, k_tail = maybe_rng_split(key, 2)
        extras: Extras = {}
        if self.periods is not None:
            x, extras = _scan(self.periods, x, attn_mask, k_periods, pos_ids)
        if self.tail is not None:
            x, tail_extras = _call(self.config.remat == "period", self.tail, x, attn_mask, k_tail, pos_ids)
            extras = _add(tail_extras, extras)
        return self.norm(x), extras

    def layers_in_order(self) -> list[MoeDecoderLayer]:
        """Every decoder layer, first to last (slices of the stacked tree: for reading, not for training)."""
        periods = list(self.periods.unstacked()) if self.periods is not None else []
        tail = [self.tail] if self.tail is not None else []
        return [layer for period in [*periods, *tail] for layer in period.layers_in_order()]
