"""The hero's architecture in small, on CPU: local sliding-window layers with their own KV width, global
layers, latent experts and shared experts, built from a `MoeShape` by the train step's own translation
(steps/model/levanter_config.py) and checked against the calculator (steps/model/model_size.py), attention's reach,
training with router-bias balancing, and a checkpoint round trip.

Five layers with every third global give one scanned period (local, local, global) and a tail (local, global):
both halves of the layout run."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from levanter.checkpoint import load_checkpoint, save_checkpoint
from levanter.layers.attention import AttentionBackend, AttentionMask
from levanter.models.lm_model import LmExample
from levanter.optim.config import AdamConfig
from levanter.trainer_state import InsideJitInfo, TrainerState
from test_moe_model import BATCH, SEQ, VOCAB, Vocab, batches, loss_fn, mesh  # noqa: F401 (mesh: a fixture)

from steps.model.levanter_config import qwen3_moe_config
from steps.model.model_size import MoeShape, active_params, ladder_shape, total_params
from steps.model.moe_layers import windowed_backend
from steps.model.moe_model import MoeConfig, MoeLMHeadModel, MoeWatchConfig, router_figures
from steps.model.router_balance import RouterBalance

pytestmark = pytest.mark.training

WINDOW = 8
HERO_SHAPE = MoeShape(d_model=32, n_layers=5, vocab_size=VOCAB, n_heads=4, head_dim=8, kv_heads_local=2,
                      kv_heads_global=1, global_every=3, sliding_window=WINDOW, n_experts=8, top_k=2, expert_width=16,
                      latent_dim=16, n_shared_experts=2, shared_width=16, seq_len=SEQ)  # fmt: skip
GLOBAL_LAYERS = [2, 4]  # every third (1-based) and the last
TRAIN_STEPS = 12


def hero_config(shape: MoeShape = HERO_SHAPE) -> MoeConfig:
    return qwen3_moe_config(shape, tokenizer_path="unused", router_aux_loss_coef=None, step="train step tiny-hero",
                            router_bias_balancing=True, router_z_loss_weight=1e-3)  # fmt: skip


def weight_count(tree: object) -> int:
    """Trained weights (arrays or abstract shapes): every floating leaf but the carried router state."""
    balances = jax.tree.leaves(tree, is_leaf=lambda node: isinstance(node, RouterBalance))
    carried = [leaf for balance in balances if isinstance(balance, RouterBalance) for leaf in jax.tree.leaves(balance)]

    def size(leaves: list) -> int:
        floating = [leaf for leaf in leaves if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)]
        return sum(int(np.prod(leaf.shape)) for leaf in floating)

    return size(jax.tree.leaves(tree)) - size(carried)


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_counts_match_the_calculator(tied: bool) -> None:
    shape = dataclasses.replace(HERO_SHAPE, tied_embeddings=tied)
    config = hero_config(shape)
    model = config.build(Vocab, key=jax.random.PRNGKey(0))
    assert weight_count(model) == total_params(shape) == config.total_trainable_params(VOCAB)

    layers = model.transformer.layers_in_order()
    assert [layer.self_attn.config.sliding_window is None for layer in layers] == [
        shape.is_global(index) for index in range(shape.n_layers)
    ]
    kv_heads = [layer.self_attn.k_proj.weight.resolve_axis("kv_head").size for layer in layers]
    assert kv_heads == [1 if index in GLOBAL_LAYERS else 2 for index in range(shape.n_layers)]
    # Active: everything but the embeddings, the head and the experts a token does not visit.
    experts = [layer.mlp.experts for layer in layers]
    routed = sum(weight_count(expert) for expert in experts)
    embeddings = weight_count(model.embeddings) + (0 if tied else weight_count(model.lm_head))
    idle = routed * (shape.n_experts - shape.top_k) // shape.n_experts
    assert weight_count(model) - embeddings - idle == active_params(shape)
    assert layers[0].mlp.experts.gate_proj.weight.resolve_axis("latent").size == 16  # experts read the latent
    assert layers[0].mlp.shared.gate_proj.weight.resolve_axis("embed").size == 32  # shared experts read d_model


@pytest.mark.parametrize(("d_model", "layers"), [(2048, 22), (6144, 48)])
def test_full_scale_models_build_with_the_calculators_size(d_model: int, layers: int) -> None:
    """The ladder's largest rung (five periods and a tail) and the hero, built abstractly (shapes only)."""
    shape = ladder_shape(d_model, layers)
    config = qwen3_moe_config(shape, tokenizer_path="unused", router_aux_loss_coef=None, step=f"train/d{d_model}",
                              router_bias_balancing=True, router_z_loss_weight=1e-4)  # fmt: skip
    model = eqx.filter_eval_shape(config.build, hax.Axis("vocab", shape.vocab_size), key=jax.random.PRNGKey(0))
    assert weight_count(model) == total_params(shape)  # the hero: 535,192,737,792
    assert model.transformer.periods.Block.size == layers // 4  # periods of local, local, local, global
    assert (model.transformer.tail is not None) == (layers % 4 > 0)  # d2048: then one local and the last


def test_local_layers_see_only_their_window() -> None:
    model = hero_config().build(Vocab, key=jax.random.PRNGKey(0))
    layers = model.transformer.layers_in_order()
    position = hax.Axis("position", SEQ)
    x = hax.random.normal(jax.random.PRNGKey(1), (position, hax.Axis("embed", 32)))
    last = SEQ - 1

    @eqx.filter_jit
    def output_at_last(layer, inputs):
        return layer(inputs, AttentionMask.causal(), key=None)[0]["position", last].array

    def moves(layer_index: int, changed_position: int) -> bool:
        changed = hax.named(x.array.at[changed_position].add(3.0), x.axes)
        before, after = output_at_last(layers[layer_index], x), output_at_last(layers[layer_index], changed)
        return not np.allclose(after, before, atol=1e-6)

    outside, inside = last - WINDOW, last - WINDOW + 1  # a local query attends to the WINDOW positions up to itself
    for local in (0, 1, 3):
        assert moves(local, inside) and not moves(local, outside) and not moves(local, 0)
    for global_layer in GLOBAL_LAYERS:
        assert moves(global_layer, outside) and moves(global_layer, 0)


def test_local_layers_avoid_the_kernel_that_drops_windows() -> None:
    """Levanter's NVTE kernel (its GPU default) gives Transformer Engine a plain causal mask: local layers
    asking for it get JAX flash attention instead, global layers keep it. (No GPU here: the choice is checked.)"""
    config = dataclasses.replace(hero_config(), attn_backend=AttentionBackend.NVTE)
    periods = eqx.filter_eval_shape(config.build, Vocab, key=jax.random.PRNGKey(0)).transformer.periods.stacked
    assert periods.local.stacked.self_attn.config.attn_backend == AttentionBackend.JAX_FLASH
    assert periods.global_layer.self_attn.config.attn_backend == AttentionBackend.NVTE
    assert windowed_backend(AttentionBackend.SPLASH) == AttentionBackend.SPLASH
    assert windowed_backend(None) is None  # on CPU the default is JAX flash, which honours windows


@pytest.fixture(scope="module")
def trained() -> tuple[MoeConfig, MoeLMHeadModel, list[float], dict]:
    """TRAIN_STEPS AdamW steps through Levanter's train state, router-bias balancing on: the model, the loss
    on the first batch at every step, and the last step's router and watch figures."""
    config = hero_config()
    optimizer = AdamConfig(learning_rate=3e-3, weight_decay=0.1, warmup=0.0, lr_schedule="constant").build(TRAIN_STEPS)
    state = TrainerState.init(
        optimizer, config.build(Vocab, key=jax.random.PRNGKey(0)), key=jax.random.PRNGKey(1), is_trainable=True
    )
    watch = MoeWatchConfig(include_per_parameter_norms=False).build()

    @eqx.filter_jit
    def step(state: TrainerState, example: LmExample):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(state.model, example)
        new_state, updates = state.take_step(grads, key=state.training_key)
        watched = watch.inside_step(state, InsideJitInfo(grads=grads, updates=updates))
        return new_state, loss, {**router_figures(grads), **watched}

    losses, figures = [], {}
    for example in (batches(2) * TRAIN_STEPS)[:TRAIN_STEPS]:
        state, loss, figures = step(state, example)
        losses.append(float(loss))
    return config, state.model, losses, figures


def test_hero_shaped_model_trains_with_bias_balancing(trained) -> None:
    _, model, losses, figures = trained
    assert losses[-1] < losses[0] - 0.3, losses
    # The bias moved (balancing runs on every layer), is centred, and is logged per layer in depth order.
    bias = np.stack([np.asarray(layer.mlp.balance.bias.array) for layer in model.transformer.layers_in_order()])
    assert np.all(np.linalg.norm(bias, axis=1) > 1e-3) and np.abs(bias.sum(axis=1)).max() < 1e-4
    for index in range(HERO_SHAPE.n_layers):
        assert float(figures[f"router/layer_{index}/bias_norm"]) > 0.0
    assert "router/layer_5/bias_norm" not in figures
    assert "params/norm/total" in figures and np.isfinite(float(figures["grad/norm/total"]))


def test_checkpoint_round_trip(trained, tmp_path) -> None:
    config, model, _, _ = trained
    save_checkpoint(model, step=TRAIN_STEPS, checkpoint_path=str(tmp_path / "step"), is_temporary=False)
    template = config.build(Vocab, key=jax.random.PRNGKey(5))
    restored = load_checkpoint(template, str(tmp_path / "step"))
    tokens = batches(1)[0].tokens
    logits = eqx.filter_jit(lambda m: m(tokens).array)
    np.testing.assert_array_equal(np.asarray(logits(restored)), np.asarray(logits(model)))
    assert not np.allclose(np.asarray(logits(template)), np.asarray(logits(model)))
    saved_bias = [layer.mlp.balance.bias.array for layer in model.transformer.layers_in_order()]
    restored_bias = [layer.mlp.balance.bias.array for layer in restored.transformer.layers_in_order()]
    np.testing.assert_array_equal(np.stack(restored_bias), np.stack(saved_bias))
    assert jnp.any(jnp.stack(saved_bias) != 0)


def test_impossible_hero_shapes_name_the_step() -> None:
    with pytest.raises(ValueError, match=r"train step tiny-hero: .*num_kv_heads_local=3"):
        hero_config(dataclasses.replace(HERO_SHAPE, kv_heads_local=3))
    with pytest.raises(ValueError, match=r"train step tiny-hero: .*num_kv_heads=3"):
        hero_config(dataclasses.replace(HERO_SHAPE, kv_heads_global=3))
    # Without local layers their KV width is never used, so it is not checked.
    assert hero_config(dataclasses.replace(HERO_SHAPE, sliding_window=None, kv_heads_local=3)).layers_per_period == 1
