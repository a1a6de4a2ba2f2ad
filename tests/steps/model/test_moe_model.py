"""steps/model/moe_model.py on CPU: a tiny MoE (d_model 32, 2 layers, 8 experts, top-2, seq 32) trained by
Levanter's own train-state code path (`TrainerState.take_step`: gradient, optimizer, overwrite of carried
state) with AdamW from Levanter's `AdamConfig`. Compiling the train step dominates the time, so one
compiled step per config serves several tests."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from levanter.models.lm_model import LmExample
from levanter.optim.config import AdamConfig
from levanter.trainer_state import InsideJitInfo, TrainerState
from levanter.utils.tree_utils import inference_mode

from steps.model.levanter_config import qwen3_moe_config
from steps.model.model_size import MoeShape
from steps.model.moe_block import DROPPED_COPIES, MoeBlock
from steps.model.moe_model import MoeConfig, MoeLMHeadModel, MoeWatchConfig, _dropped_fraction, router_figures
from steps.model.router_balance import GRID, excess_histogram
from steps.train.parallelism import precision_policy

pytestmark = pytest.mark.training

EXPERTS, TOP_K, LAYERS, D_MODEL, SEQ, VOCAB, BATCH = 8, 2, 2, 32, 32, 128, 8
STEPS = 30
Z_LOSS = 1e-2
Vocab = hax.Axis("vocab", VOCAB)
Batch = hax.Axis("batch", BATCH)


def tiny_config(**changes) -> MoeConfig:
    fields = dict(max_seq_len=SEQ, hidden_dim=D_MODEL, intermediate_dim=64, moe_intermediate_dim=64,
                  num_layers=LAYERS, num_heads=2, head_dim=16, num_kv_heads=1, num_experts=EXPERTS,
                  num_experts_per_tok=TOP_K, router_aux_loss_coef=None, router_z_loss_weight=Z_LOSS,
                  num_shared_experts=1, shared_expert_intermediate_dim=32, gradient_checkpointing=False,
                  tokenizer="unused", reference_checkpoint="unused")  # fmt: skip
    return MoeConfig(**{**fields, **changes})


@pytest.fixture(scope="module", autouse=True)
def mesh():
    """Levanter's MoE permutation runs under shard_map, which needs a device mesh (one CPU device here)."""
    with hax.partitioning.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))):
        yield


def batches(count: int) -> list[LmExample]:
    keys = jax.random.split(jax.random.PRNGKey(7), count)
    tokens = [hax.random.randint(key, (Batch, hax.Axis("position", SEQ)), 0, VOCAB) for key in keys]
    return [hax.vmap(LmExample.causal, Batch)(ids) for ids in tokens]


def moe_blocks(model: MoeLMHeadModel) -> MoeBlock:
    """Every layer's MoE block, stacked: with every layer global, each period is one global layer."""
    return model.transformer.periods.stacked.global_layer.mlp


def skewed_model(config: MoeConfig) -> MoeLMHeadModel:
    """Every token embedding shares one large direction u, and experts 0 and 1 of every layer's router look
    along u: nearly every token picks those two."""
    model = config.build(Vocab, key=jax.random.PRNGKey(0))
    direction = jax.random.normal(jax.random.PRNGKey(3), (D_MODEL,))
    direction = direction / jnp.linalg.norm(direction)
    embeddings = model.embeddings.token_embeddings.weight
    shifted = (embeddings + 0.5 * hax.named(direction, config.Embed)).rearrange(embeddings.axes)
    gate = moe_blocks(model).gate.weight
    favoured = (jnp.arange(EXPERTS) < 2).astype(jnp.float32)
    skew = hax.named(jnp.einsum("e,d->ed", favoured, direction), (config.RouterExperts, config.Embed))
    model = eqx.tree_at(lambda m: m.embeddings.token_embeddings.weight, model, shifted)
    return eqx.tree_at(lambda m: moe_blocks(m).gate.weight, model, (gate + skew).rearrange(gate.axes))


def loss_fn(model: MoeLMHeadModel, example: LmExample) -> jax.Array:
    return model.compute_next_token_loss(example).scalar()


def train(config: MoeConfig) -> tuple[list[dict[str, float]], TrainerState, TrainerState, dict]:
    """STEPS AdamW steps (weight decay 0.5) on a skewed start; the router figures of every step's gradient
    (loads of that batch), the states before and after the last step and the last step's watch figures."""
    optimizer = AdamConfig(learning_rate=1e-3, weight_decay=0.5, warmup=0.0, lr_schedule="constant").build(STEPS)
    state = TrainerState.init(optimizer, skewed_model(config), key=jax.random.PRNGKey(1), is_trainable=True)
    watch = MoeWatchConfig(include_per_parameter_norms=False).build()

    @eqx.filter_jit
    def step(state: TrainerState, example: LmExample):
        _, grads = eqx.filter_value_and_grad(loss_fn)(state.model, example)
        new_state, updates = state.take_step(grads, key=state.training_key)
        return new_state, router_figures(grads), watch.inside_step(state, InsideJitInfo(grads=grads, updates=updates))

    figures = []
    for example in batches(4) * (STEPS // 4) + batches(4)[: STEPS % 4]:
        previous = state
        state, step_figures, watched = step(state, example)
        figures.append({name: float(value) for name, value in step_figures.items()})
    return figures, previous, state, watched


def final_loss(config: MoeConfig, compute_dtype: str) -> tuple[float, TrainerState]:
    """STEPS AdamW steps under the train step's precision policy, as Levanter's trainer applies it (the f32
    model is cast to the compute dtype inside the differentiated loss); the mean loss of the last 5 steps."""
    policy = precision_policy(compute_dtype)
    optimizer = AdamConfig(learning_rate=1e-3, weight_decay=0.1, warmup=0.0, lr_schedule="constant").build(STEPS)
    model = config.build(Vocab, key=jax.random.PRNGKey(0))
    state = TrainerState.init(optimizer, model, key=jax.random.PRNGKey(1), is_trainable=True, mp=policy)

    @eqx.filter_jit
    def step(state: TrainerState, example: LmExample):
        loss, grads = eqx.filter_value_and_grad(lambda m: loss_fn(state.mp.cast_to_compute(m), example))(state.model)
        return state.take_step(grads, key=state.training_key)[0], loss

    losses = []
    for example in batches(4) * (STEPS // 4) + batches(4)[: STEPS % 4]:
        state, loss = step(state, example)
        losses.append(float(loss))
    return float(np.mean(losses[-5:])), state


@pytest.mark.slow
def test_bf16_compute_over_f32_master_weights_trains_within_2_percent_of_f32() -> None:
    f32_loss, _ = final_loss(tiny_config(), "float32")
    bf16_loss, state = final_loss(tiny_config(), "bfloat16")
    assert bf16_loss == pytest.approx(f32_loss, rel=0.02) and bf16_loss != f32_loss
    trained = jax.tree.leaves(eqx.filter(state.model, eqx.is_inexact_array))
    moments = jax.tree.leaves(eqx.filter(state.opt_state, eqx.is_inexact_array))
    assert {leaf.dtype for leaf in trained + moments} == {jnp.dtype(jnp.float32)}  # master weights and AdamW
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        precision_policy("float8")


@pytest.fixture(scope="module")
def balanced_run() -> tuple[list[dict[str, float]], TrainerState, TrainerState, dict]:
    return train(tiny_config(router_bias_balancing=True))


def late_median(figures: list[dict[str, float]], name: str) -> float:
    """The median of `name` over the last 10 steps: one batch's load is noisy (256 tokens on 8 experts), and a
    batch where some expert gets no token makes max/min infinite, so a mean would be one batch's luck."""
    return float(np.median([step[name] for step in figures[-10:]]))


@pytest.mark.slow
def test_bias_balancing_brings_load_toward_balance(balanced_run) -> None:
    unbalanced = train(tiny_config(router_bias_balancing=False))[0]
    balanced = balanced_run[0]
    start = unbalanced[0]["router/load/max_over_mean"]
    assert balanced[0]["router/load/max_over_mean"] == pytest.approx(start)  # same start, same first batch
    assert start > 3.5  # nearly every token on 2 of 8 experts (4.0 = all of them); a fair share is 1.0
    assert late_median(unbalanced, "router/load/max_over_mean") > 3.0
    assert late_median(unbalanced, "router/load/max_over_min") > 20.0  # inf: some expert gets no token at all
    # Over init seeds 0-5 the balanced run's late medians were 1.7-2.4 (max/mean) and 5-15 (max/min).
    assert late_median(balanced, "router/load/max_over_mean") < 2.6
    balanced_ratio = late_median(balanced, "router/load/max_over_mean")
    assert balanced_ratio < 0.7 * late_median(unbalanced, "router/load/max_over_mean")
    assert late_median(balanced, "router/load/max_over_min") < 17.0


@pytest.mark.slow
def test_bias_is_not_decayed_nor_in_trained_norms(balanced_run) -> None:
    _, previous, state, watched = balanced_run
    bias = moe_blocks(state.model).balance.routing_bias().array
    # After the last step the next bias is the rule's value for the last batch, centred: no decay, no Adam.
    assert np.abs(bias.sum(axis=-1)).max() < 1e-5
    assert float(watched["router/bias/norm"]) == pytest.approx(float(jnp.linalg.norm(bias)), rel=1e-5)
    assert float(watched["router/bias/norm"]) > 0.1
    # The watch reads the state the step started from.
    trained = eqx.tree_at(lambda m: moe_blocks(m).balance, previous.model, replace=None)
    trained_norm = jnp.sqrt(
        sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves(eqx.filter(trained, eqx.is_inexact_array)))
    )
    assert float(watched["params/norm/total"]) == pytest.approx(float(trained_norm), rel=1e-4)
    assert "router/load/max_over_min" in watched and "grad/norm/total" in watched


def test_the_watch_compiled_once_gives_levanters_figures_only_every_interval_steps() -> None:
    """`MoeWatchConfig.compile_once(3)`: Levanter sees interval 1 (so compiles one train step, hook inside), and the
    callback computes inside that step, and logs, only where Levanter's interval-3 watch would."""
    once, plain = MoeWatchConfig.compile_once(3), MoeWatchConfig(interval=3, include_per_parameter_norms=False)
    assert (once.interval, once.log_interval, plain.log_interval) == (1, 3, None)
    once = dataclasses.replace(once, include_per_parameter_norms=False).build()
    plain = plain.build()
    optimizer = AdamConfig(learning_rate=1e-3, warmup=0.0, lr_schedule="constant").build(STEPS)
    state = TrainerState.init(optimizer, tiny_config().build(Vocab, key=jax.random.PRNGKey(0)),
                              key=jax.random.PRNGKey(1), is_trainable=True)  # fmt: skip

    @eqx.filter_jit
    def step(state: TrainerState, example: LmExample):
        _, grads = eqx.filter_value_and_grad(loss_fn)(state.model, example)
        new_state, updates = state.take_step(grads, key=state.training_key)
        info = InsideJitInfo(grads=grads, updates=updates)
        return new_state, once.inside_step(state, info), plain.inside_step(state, info)

    logged = []

    class Logged:
        def __init__(self, step: int):
            self.step, self.next_step = step, step + 1

    for index, example in enumerate(batches(6)):
        state, inside, reference = step(state, example)
        assert set(inside) == set(reference)
        if (index + 1) % 3 == 0:
            for name in reference:
                np.testing.assert_array_equal(np.asarray(inside[name]), np.asarray(reference[name]), err_msg=name)
            assert float(inside["grad/norm/total"]) > 0
        else:
            assert all(not np.any(np.asarray(value)) for value in inside.values()), index
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("levanter.tracker.log", lambda figures, step: logged.append(step))
            once.on_step(Logged(index), inside)
    assert logged == [2, 5]


def with_bias(block: MoeBlock, bias: np.ndarray) -> MoeBlock:
    balance = dataclasses.replace(block.balance, bias=hax.named(bias, "experts"))
    return eqx.tree_at(lambda b: b.balance, block, balance)


@pytest.mark.slow
def test_bias_rule_on_hand_made_logits() -> None:
    """`_select` routes by the carried bias and leaves that bias, the batch's loads and its excess histogram;
    the bias it gives the next batch is the rule's, each expert's quantile within a grid bin of numpy's."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, EXPERTS)).astype(np.float32) + np.linspace(0, 2, EXPERTS, dtype=np.float32)
    bias = rng.normal(size=EXPERTS).astype(np.float32)
    block = with_bias(MoeBlock.init(tiny_config(router_bias_balancing=True), key=jax.random.PRNGKey(0)), bias)
    chosen, weights, carried = eqx.filter_jit(block._select)(jnp.asarray(logits))  # one compile, not one per op

    scores = logits + bias
    order = np.argsort(-scores, axis=1)
    excess = scores - np.take_along_axis(scores, order[:, TOP_K : TOP_K + 1], axis=1)
    np.testing.assert_array_equal(np.asarray(carried.bias.array), bias)  # the bias this batch was routed by
    np.testing.assert_array_equal(np.asarray(carried.load.array), np.bincount(order[:, :TOP_K].ravel(), minlength=8))
    histogram = np.asarray(excess_histogram(jnp.asarray(excess)))
    np.testing.assert_allclose(np.asarray(carried.excess.array), histogram, rtol=1e-5, atol=1e-5)
    exact = np.quantile(excess, 1 - TOP_K / EXPERTS, axis=0, method="inverted_cdf")
    width = np.diff(GRID)[np.searchsorted(GRID, exact) - 1]  # of the grid bin holding the exact quantile
    shift = bias - np.asarray(carried.routing_bias().array)  # the quantiles less their mean
    assert np.all(np.abs(shift - shift.mean() - (exact - exact.mean())) <= 2 * width.max())
    assert np.array_equal(np.sort(np.asarray(chosen), axis=1), np.sort(order[:, :TOP_K], axis=1))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    picked = np.take_along_axis(probs, np.asarray(chosen), axis=1)
    np.testing.assert_allclose(np.asarray(weights), picked / picked.sum(axis=1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize(("combine", "total"), [("sigmoid", 2.5), ("softmax", 1.0), ("softmax", 3.0)])
def test_combine_weights_are_the_gate_of_the_chosen_renormalised_to_their_sum(combine: str, total: float) -> None:
    """The hero's rule (top-k of logits + bias routes; sigmoid of the chosen logits, renormalised to sum 2.5,
    combines) and the softmax form, against numpy."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(64, EXPERTS)).astype(np.float32) * 3
    bias = rng.normal(size=EXPERTS).astype(np.float32)
    config = tiny_config(router_combine=combine, router_combine_sum=total)
    block = with_bias(MoeBlock.init(config, key=jax.random.PRNGKey(0)), bias)
    chosen, weights, _ = eqx.filter_jit(block._select)(jnp.asarray(logits))

    expected_chosen = np.argsort(-(logits + bias), axis=1)[:, :TOP_K]
    assert np.array_equal(np.sort(np.asarray(chosen), axis=1), np.sort(expected_chosen, axis=1))
    if combine == "sigmoid":
        gate = 1 / (1 + np.exp(-logits))
    else:
        gate = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    picked = np.take_along_axis(gate, np.asarray(chosen), axis=1)
    np.testing.assert_allclose(np.asarray(weights), total * picked / picked.sum(axis=1, keepdims=True), rtol=1e-5)


def test_full_hero_recipe_trains_and_evaluates_with_the_sigmoid_rule() -> None:
    from experiments.hero_535b import build_dag, full_scale

    dag = build_dag(full_scale())
    configs = [step.config for step in dag.steps if step.name.startswith(("train/", "evaluate/"))]
    assert len(configs) == 10
    for config in configs:
        assert (config.router_combine.value, config.router_combine_sum.value) == ("sigmoid", 2.5)


@pytest.mark.slow
def test_z_loss_and_shared_experts_change_the_loss() -> None:
    config = tiny_config()
    model = config.build(Vocab, key=jax.random.PRNGKey(0))
    zero_gate = eqx.tree_at(lambda m: moe_blocks(m).gate.weight.array, model,
                            jnp.zeros_like(moe_blocks(model).gate.weight.array))  # fmt: skip
    example = batches(1)[0]
    loss = eqx.filter_jit(loss_fn)
    # Zero router logits: logsumexp = log E for every token, so the z-loss adds Z_LOSS * layers * log(E)^2.
    train_loss = float(loss(zero_gate, example))
    eval_loss = float(loss(inference_mode(zero_gate, True), example))
    assert train_loss - eval_loss == pytest.approx(Z_LOSS * LAYERS * np.log(EXPERTS) ** 2, rel=1e-3)
    shared_out = moe_blocks(model).shared.down_proj.weight.array
    no_shared = eqx.tree_at(lambda m: moe_blocks(m).shared.down_proj.weight.array, model, jnp.zeros_like(shared_out))
    assert abs(float(loss(model, example)) - float(loss(no_shared, example))) > 1e-4
    weights = eqx.tree_at(lambda m: moe_blocks(m).balance, model, replace=None)
    counted = sum(leaf.size for leaf in jax.tree.leaves(eqx.filter(weights, eqx.is_inexact_array)))
    assert counted == config.total_trainable_params(VOCAB)  # shared experts counted: 3 x 32 x 32 per layer


def test_train_shape_builds_the_moe_config() -> None:
    shape = MoeShape(d_model=D_MODEL, n_layers=LAYERS, vocab_size=VOCAB, n_heads=2, head_dim=16, kv_heads_local=1,
                     kv_heads_global=1, global_every=1, sliding_window=None, n_experts=EXPERTS, top_k=TOP_K,
                     expert_width=64, latent_dim=None, n_shared_experts=2, shared_width=24, seq_len=SEQ)  # fmt: skip
    config = qwen3_moe_config(shape, tokenizer_path="tok", router_aux_loss_coef=None, step="train step x",
                              router_bias_balancing=True, router_z_loss_weight=1e-4)  # fmt: skip
    assert isinstance(config, MoeConfig)
    assert (config.num_shared_experts, config.shared_expert_intermediate_dim) == (2, 24)
    assert config.router_bias_balancing and config.router_z_loss_weight == 1e-4
    every_expert = dataclasses.replace(shape, top_k=EXPERTS)
    with pytest.raises(ValueError, match="train step x: router-bias balancing needs top_k < n_experts"):
        qwen3_moe_config(every_expert, tokenizer_path="tok", router_aux_loss_coef=None, step="train step x",
                         router_bias_balancing=True)  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(num_experts_per_tok=9), "greater than num_experts"),
        (dict(num_experts_per_tok=8, router_bias_balancing=True), "needs top_k < n_experts"),
        (dict(router_z_loss_weight=-1.0), "router_z_loss_weight"),
        (dict(num_shared_experts=2, shared_expert_intermediate_dim=0), "shared experts"),
        (dict(num_shared_experts=0, shared_expert_intermediate_dim=16), "shared experts"),
        (dict(dense_router_gradient=True), "dense_router_gradient"),
        (dict(sliding_window=8, global_every=0), "global_every"),
        (dict(sliding_window=0), "sliding_window"),
        (dict(expert_latent_dim=0), "expert_latent_dim"),
        (dict(router_combine="relu"), "router_combine must be one of"),
        (dict(router_combine_sum=0.0), "router_combine_sum must be positive"),
        (dict(router_combine_sum=2.5, norm_topk_prob=False), "set norm_topk_prob"),
        (dict(sliding_window=8, global_every=2, num_kv_heads_local=3), "num_kv_heads_local=3"),
    ],
)
def test_impossible_configs_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**changes)


@pytest.mark.slow
def test_capacity_keeps_each_experts_first_tokens_of_each_sequence_and_drops_the_rest() -> None:
    """capacity_factor: with room for every token it equals the dropless grouped matmul; with less, each expert
    serves the first `capacity` tokens of each sequence that chose it (in token order) and the others get
    nothing from it: per sequence, so a device holding some of the batch's sequences (expert parallelism,
    tests/steps/model/test_expert_parallel.py) or a microbatch drops what the whole batch on one device drops."""
    config = tiny_config(num_shared_experts=0, shared_expert_intermediate_dim=0)
    block = MoeBlock.init(config, key=jax.random.PRNGKey(0))
    sequences, position = hax.Axis("batch", 3), hax.Axis("position", SEQ)
    x = hax.random.normal(jax.random.PRNGKey(1), (sequences, position, config.Embed))

    def output(capacity_factor: float | None) -> np.ndarray:
        with_capacity = dataclasses.replace(block, config=dataclasses.replace(config, capacity_factor=capacity_factor))
        return np.asarray(eqx.filter_jit(lambda b, x: b(x)[0].array)(with_capacity, x))

    dropless = output(None)
    np.testing.assert_allclose(output(EXPERTS / TOP_K), dropless, rtol=1e-5, atol=1e-6)  # room for every token

    factor = 0.5
    tokens = np.asarray(x.array).reshape(-1, D_MODEL)
    logits = block.gate(x).rearrange((sequences, position, config.RouterExperts)).array.reshape(-1, EXPERTS)
    chosen, weights = (np.asarray(a) for a in block._select(logits.astype(jnp.float32))[:2])
    capacity = int(np.ceil(factor * SEQ * TOP_K / EXPERTS))
    gate, up, down = (np.asarray(p.weight.rearrange(("experts", p.In, p.Out)).array)
                      for p in (block.experts.gate_proj, block.experts.up_proj, block.experts.down_proj))  # fmt: skip
    expected, served = np.zeros_like(tokens), np.zeros((sequences.size, EXPERTS), dtype=int)
    drops = np.zeros(sequences.size * SEQ, dtype=int)
    for token in range(sequences.size * SEQ):
        for slot in range(TOP_K):
            expert, sequence = chosen[token, slot], token // SEQ
            served[sequence, expert] += 1
            drops[token] += served[sequence, expert] > capacity
            if served[sequence, expert] <= capacity:
                hidden = np.asarray(jax.nn.silu(tokens[token] @ gate[expert])) * (tokens[token] @ up[expert])
                expected[token] += weights[token, slot] * (hidden @ down[expert])
    # Some tokens are dropped, and a capacity over the whole batch (3 x capacity per expert) would keep some.
    assert served.max() > capacity and (served.sum(0) > 3 * capacity).sum() < (served > capacity).sum()
    np.testing.assert_allclose(output(factor), expected.reshape(dropless.shape), rtol=1e-4, atol=1e-5)
    # What the train step logs as router/dropped_fraction, from a batch's loads: exact for one sequence (over
    # more, a lower bound: a sequence cannot lend its unused slots to another).
    dropped = np.maximum(served[0] - capacity, 0).sum() / (SEQ * TOP_K)
    assert float(_dropped_fraction(jnp.asarray(served[:1], jnp.float32), factor)[0]) == dropped
    # Evaluation drops as training does, and says which tokens lost copies.
    evaluating = dataclasses.replace(block, config=dataclasses.replace(config, capacity_factor=factor))

    @eqx.filter_jit
    def evaluate(block: MoeBlock) -> tuple[jax.Array, hax.NamedArray]:
        out, extras = block(x)
        return out.array, extras[DROPPED_COPIES]

    evaluated, dropped_copies = evaluate(inference_mode(evaluating, True))
    np.testing.assert_allclose(np.asarray(evaluated), expected.reshape(dropless.shape), rtol=1e-4, atol=1e-5)
    assert dropped_copies.axes == (sequences, position)
    np.testing.assert_array_equal(np.asarray(dropped_copies.array).reshape(-1), drops)
