"""The hero optimizer (steps/train/optimizer.py) against Levanter's own Newton-Schulz and the published recipe, on
the hero-shaped tiny model.

A MuonH step of one matrix is Levanter's `zeropower_via_newtonschulz5` on the recipe's schedule (the hero's
"quintic": Levanter's `NEWTON_SCHULZ_COEFFICIENTS`, one triple per step, read from Levanter, never copied here)
followed by the hyperball step; each matrix of a stack (layers, experts) is orthogonalised and kept at its norm on
its own; the recipe runs unclipped with every rate under the heuristic's cap; the mask puts every trained
parameter of the tiny hero model in exactly one group, and the router bias in none.
"""

from __future__ import annotations

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import haliax.quantization as hq
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from levanter.models.lm_model import LmExample
from levanter.optim.util import NEWTON_SCHULZ_COEFFICIENTS, zeropower_via_newtonschulz5
from levanter.trainer_state import TrainerState

from experiments.hero_535b import full_scale, tiny_scale, tiny_shape
from steps.model.levanter_config import qwen3_moe_config
from steps.model.router_balance import is_router_state
from steps.train.memory_model import optimizer_groups as planned_groups
from steps.train.optimizer import (
    GROUPS,
    HeroHyperparameters,
    HeroOptimizerConfig,
    levanter_optimizer,
    newton_schulz,
    optimizer_groups,
    parameter_groups,
    scale_by_adamh,
    scale_by_muonh,
)
from steps.train.train_config import NEWTON_SCHULZ_SCHEDULES, MoeHeuristic

VOCAB = 128
In, Out, Experts = hax.Axis("in", 24), hax.Axis("out", 40), hax.Axis("experts", 4)


def levanter_orthogonal(matrix: np.ndarray, schedule: str = "quintic") -> np.ndarray:
    """Levanter's own iteration on `matrix`, five steps, as its MuonH calls it (`muon_epsilon` 1e-8), in float32."""
    orthogonal = zeropower_via_newtonschulz5(jnp.asarray(matrix, jnp.float32), steps=5, eps=1e-8,
                                             coefficient_type=schedule)  # fmt: skip
    return np.asarray(orthogonal, dtype=np.float64)


def table_iteration(matrix: np.ndarray, schedule: str, steps: int = 5) -> np.ndarray:
    """The iteration in float64 NumPy, step i on the i-th (a, b, c) of Levanter's table for `schedule`:
    X <- a X + (b A + c A^2) X, A = X X^T, on the short side."""
    x = np.asarray(matrix, dtype=np.float64)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / (np.linalg.norm(x) + 1e-8)
    table = NEWTON_SCHULZ_COEFFICIENTS[schedule]
    for step in range(steps):
        a, b, c = table[step % len(table)]
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


def reference_hyperball(param: np.ndarray, direction: np.ndarray, rate: float) -> np.ndarray:
    norm = np.linalg.norm(param)
    moved = param - rate * direction * norm / np.linalg.norm(direction)
    return moved * norm / np.linalg.norm(moved)


def linear(key: int, *, experts: bool = False) -> hnn.Linear | hnn.MoELinear:
    if experts:
        return hnn.MoELinear.init(Experts, In, Out, key=jax.random.PRNGKey(key), use_bias=False)
    return hnn.Linear.init(In, Out, key=jax.random.PRNGKey(key), use_bias=False)


def random_like(module: eqx.Module, key: int) -> eqx.Module:
    weight = module.weight
    values = jax.random.normal(jax.random.PRNGKey(key), weight.array.shape)
    return eqx.tree_at(lambda m: m.weight, module, hax.named(values, weight.axes))


def matrices(weight: hax.NamedArray, *stack: hax.Axis) -> np.ndarray:
    """The weight as (stack..., out, in) float64 matrices."""
    return np.asarray(weight.rearrange((*stack, Out, In)).array, dtype=np.float64)


def test_the_muonh_update_of_one_matrix_is_levanters_newton_schulz_then_the_hyperball_step() -> None:
    param, grad = linear(0), random_like(linear(0), 1)
    rate = 0.05
    muonh = scale_by_muonh(momentum=0.95, steps=5, learning_rate=rate)
    update, _ = muonh.update(grad, muonh.init(param), param)
    # The first step's Nesterov direction is (1 + momentum) x the gradient, which the iteration normalises away.
    orthogonal = levanter_orthogonal(1.95 * matrices(grad.weight))
    expected = reference_hyperball(matrices(param.weight), orthogonal, rate) - matrices(param.weight)
    np.testing.assert_allclose(matrices(update.weight), expected, atol=1e-6)
    # Muon's single "simple" triple is another update: far more than the tolerance above.
    simple = levanter_orthogonal(1.95 * matrices(grad.weight), "simple")
    other = reference_hyperball(matrices(param.weight), simple, rate) - matrices(param.weight)
    assert np.abs(other - expected).max() > 1e-4


@pytest.mark.parametrize("schedule", sorted(NEWTON_SCHULZ_COEFFICIENTS))
def test_each_newton_schulz_step_takes_its_own_triple_of_levanters_table(schedule: str) -> None:
    grad = np.asarray(jax.random.normal(jax.random.PRNGKey(5), (Out.size, In.size)))
    ours = np.asarray(newton_schulz(jnp.asarray(grad), 5, schedule, 1e-8), dtype=np.float64)
    np.testing.assert_allclose(ours, levanter_orthogonal(grad, schedule), atol=1e-6)
    np.testing.assert_allclose(ours, table_iteration(grad, schedule), atol=1e-4)
    # A schedule of several triples run as its first one (the old single-triple loop) lands elsewhere.
    if len({tuple(triple) for triple in NEWTON_SCHULZ_COEFFICIENTS[schedule][:5]}) > 1:
        first_only = table_iteration(grad, schedule, steps=1)
        for _ in range(4):
            first_only = table_iteration(first_only, schedule, steps=1)
        assert np.abs(first_only - ours).max() > 1e-3


def test_the_heros_quintic_schedule_ends_nearer_to_orthogonal_than_the_simple_one() -> None:
    grad = np.asarray(jax.random.normal(jax.random.PRNGKey(6), (Out.size, In.size)))
    quintic = np.linalg.svd(levanter_orthogonal(grad, "quintic"), compute_uv=False)
    simple = np.linalg.svd(levanter_orthogonal(grad, "simple"), compute_uv=False)
    assert 0.95 < quintic.min() and quintic.max() < 1.05, quintic  # measured: [0.978, 1.03]
    assert simple.min() < 0.75 and simple.max() > 1.1, simple  # measured: [0.68, 1.13]


@pytest.mark.parametrize("optimizer", ["muonh", "adamh"])
def test_the_hyperball_step_keeps_each_matrix_at_its_frobenius_norm(optimizer: str) -> None:
    param = linear(2, experts=True)
    norms = np.linalg.norm(matrices(param.weight, Experts), axis=(-2, -1))
    transform = (scale_by_muonh(0.95, 5, 0.1) if optimizer == "muonh" else scale_by_adamh(0.9, 0.95, 1e-8, 0.1))
    state = transform.init(param)
    for step in range(5):
        update, state = transform.update(random_like(param, 10 + step), state, param)
        param = optax.apply_updates(param, update)
        after = np.linalg.norm(matrices(param.weight, Experts), axis=(-2, -1))
        np.testing.assert_allclose(after, norms, rtol=1e-5)


def test_stacked_expert_weights_are_orthogonalised_expert_by_expert() -> None:
    param, grad = linear(3, experts=True), random_like(linear(3, experts=True), 4)
    rate = 0.05
    muonh = scale_by_muonh(momentum=0.95, steps=5, learning_rate=rate)
    update, _ = muonh.update(grad, muonh.init(param), param)
    got = matrices(update.weight, Experts)
    weights, grads = matrices(param.weight, Experts), matrices(grad.weight, Experts)
    for expert in range(Experts.size):
        direction = levanter_orthogonal(1.95 * grads[expert])
        expected = reference_hyperball(weights[expert], direction, rate) - weights[expert]
        np.testing.assert_allclose(got[expert], expected, atol=1e-6)
    # Orthogonalising the experts as one (experts x out, in) matrix would be another update.
    whole = levanter_orthogonal(1.95 * grads.reshape(-1, In.size)).reshape(grads.shape)
    assert not np.allclose(got[0], reference_hyperball(weights[0], whole[0], rate) - weights[0], atol=1e-3)


@pytest.fixture(scope="module")
def hero_model() -> eqx.Module:
    """The tiny hero model (latent experts, shared experts, local and global layers, router-bias balancing)."""
    config = qwen3_moe_config(tiny_shape(32, 2, VOCAB), tokenizer_path="unused", router_aux_loss_coef=None,
                              router_bias_balancing=True, router_z_loss_weight=1e-4, capacity_factor=1.15,
                              router_combine="sigmoid", router_combine_sum=2.5, step="test")  # fmt: skip
    with hax.partitioning.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))):
        yield config.build(hax.Axis("vocab", VOCAB), key=jax.random.PRNGKey(0))


def trained_part(model: eqx.Module) -> eqx.Module:
    """What Levanter's optimizer sees: the floating weights, less the router state it carries in the gradient."""
    return eqx.filter(hq.partition_for_grad_overwrite(model)[1], eqx.is_inexact_array)


@pytest.mark.slow
def test_the_mask_puts_every_trained_parameter_in_exactly_one_group(hero_model) -> None:
    trained = trained_part(hero_model)
    labels = jax.tree.leaves(parameter_groups(trained))
    assert len(labels) == len(jax.tree.leaves(trained)) and set(labels) == set(GROUPS)
    groups = optimizer_groups(trained)
    assert len(groups) == len(labels)
    assert {path for path, group in groups.items() if group == "adamh"} == {"lm_head.weight"}
    adam = {path for path, group in groups.items() if group == "adam"}
    assert "embeddings.token_embeddings.weight" in adam and "transformer.norm.weight" in adam
    assert all(path.endswith(("layernorm.weight", "mlp.gate.weight", "norm.weight")) for path in adam - {
        "embeddings.token_embeddings.weight"})  # fmt: skip
    muonh = {path for path, group in groups.items() if group == "muonh"}
    for matrix in ("self_attn.q_proj", "self_attn.o_proj", "experts.gate_proj", "experts.down_proj",
                   "shared.up_proj", "latent_in", "latent_out"):  # fmt: skip
        assert any(matrix in path for path in muonh), matrix
    # The router bias is carried by the gradient (steps/model/router_balance.py), in no group.
    router_states = jax.tree.leaves(hero_model, is_leaf=is_router_state)
    assert any(is_router_state(node) for node in router_states)
    assert not any("balance" in path for path in groups)
    # The memory plan's group sizes are the mask's.
    sizes = dict.fromkeys(GROUPS, 0)
    for path, leaf in jax.tree_util.tree_flatten_with_path(trained)[0]:
        sizes[groups[jax.tree_util.keystr(path).split("[")[0].lstrip(".")]] += leaf.size
    assert sizes == planned_groups(tiny_shape(32, 2, VOCAB))


@pytest.mark.training
def test_the_hero_optimizer_trains_the_tiny_hero_model_and_leaves_the_router_bias_to_its_rule(hero_model) -> None:
    rates = MoeHeuristic().hyperparameters(tokens=30 * 8 * 64, tokens_per_batch=8 * 64, hidden_dim=32)
    optimizer = HeroOptimizerConfig(hyperparameters=rates, warmup=0.1, min_lr_ratio=0.05, lr_schedule="linear")
    batch, position = hax.Axis("batch", 8), hax.Axis("position", 64)
    examples = [hax.vmap(LmExample.causal, batch)(hax.random.randint(key, (batch, position), 0, VOCAB))
                for key in jax.random.split(jax.random.PRNGKey(7), 4)]  # fmt: skip
    with hax.partitioning.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))):
        state = TrainerState.init(optimizer.build(30), hero_model, key=jax.random.PRNGKey(1), is_trainable=True)

        @eqx.filter_jit
        def step(state: TrainerState, example: LmExample):
            loss, grads = eqx.filter_value_and_grad(lambda m: m.compute_next_token_loss(example).scalar())(state.model)
            return state.take_step(grads, key=state.training_key)[0], loss

        losses = []
        for index in range(30):
            state, loss = step(state, examples[index % 4])
            losses.append(float(loss))
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses
    bias = np.concatenate([np.ravel(node.bias.array) for node in jax.tree.leaves(
        state.model, is_leaf=is_router_state) if is_router_state(node)])  # fmt: skip
    assert np.any(bias != 0)  # moved by the balancing rule, with no optimizer state of its own


def test_the_heuristic_is_the_published_formula() -> None:
    heuristic = MoeHeuristic()
    tokens, batch, width = 1.8e13, 11_264 * 4096, 6144
    rates = heuristic.hyperparameters(tokens, batch, width)
    adam = 0.06602 * tokens**-0.395 * width**-0.150 * batch**0.5
    assert rates.adam_lr == pytest.approx(adam) and rates.muonh_lr == pytest.approx(13 / 3 * adam)
    assert rates.epsilon == pytest.approx(9.676e-18 * (tokens / batch) ** 0.5)
    assert rates.beta2 == 0.95 and rates.beta1 == 0.9062  # 0.999^(46M / 131k) is far below the clip
    assert heuristic.hyperparameters(1e6, 512, 32).beta2 == 0.9999
    capped = heuristic.hyperparameters(1e3, 1e6, 8)
    assert capped.adam_lr == capped.muonh_lr == capped.adamh_lr == 0.05
    with pytest.raises(ValueError, match="positive tokens"):
        heuristic.hyperparameters(0, 512, 32)


def test_the_cap_holds_the_muonh_and_adamh_rates_where_only_they_reach_it() -> None:
    """The tiny hero's d768 rung (100 steps of 8 x 64 tokens at width 32): 13/3 x its Adam rate is 0.0531."""
    tokens, batch, width = 100 * 8 * 64, 8 * 64, 32
    adam = 0.06602 * tokens**-0.395 * width**-0.150 * batch**0.5
    assert adam < 0.05 < 13 / 3 * adam
    rates = MoeHeuristic().hyperparameters(tokens, batch, width)
    assert rates.adam_lr == pytest.approx(adam) and rates.muonh_lr == rates.adamh_lr == 0.05


@pytest.mark.parametrize("scale", ["tiny", "full"])
def test_the_hero_recipe_is_the_published_one_on_every_rung(scale: str) -> None:
    plan = tiny_scale() if scale == "tiny" else full_scale()
    for rung in (*plan.rungs, plan.hero):
        rates = rung.hero_hyperparameters(plan.recipe)
        assert rates.max_grad_norm is None, rung.name  # unclipped: Marin's "1pct-noclip"
        assert (rates.newton_schulz_coefficients, rates.newton_schulz_steps) == ("quintic", 5), rung.name
        assert max(rates.adam_lr, rates.muonh_lr, rates.adamh_lr) <= MoeHeuristic().max_lr, rung.name


def small_model(key: int) -> dict:
    """One parameter of each group: an embedding (adam), a projection (muonh) and a readout (adamh)."""
    keys = jax.random.split(jax.random.PRNGKey(key), 3)
    embedding = hax.named(jax.random.normal(keys[0], (Out.size, In.size)), (Out, In))
    proj = hnn.Linear.init(In, Out, key=keys[1], use_bias=False)
    return {"embeddings": embedding, "proj": proj, "lm_head": hnn.Linear.init(In, Out, key=keys[2], use_bias=False)}


def first_update(settings: HeroHyperparameters, grads: dict, params: dict) -> tuple[dict, optax.OptState]:
    optimizer = HeroOptimizerConfig(hyperparameters=settings, warmup=0.0, min_lr_ratio=0.05, lr_schedule="linear")
    transform = optimizer.build(10)
    return transform.update(grads, transform.init(params), params)


def test_the_hero_optimizer_runs_the_schedule_its_hyperparameters_name() -> None:
    params, grads = small_model(0), small_model(1)
    settings = MoeHeuristic().hyperparameters(100 * 8 * 64, 8 * 64, 32)
    for schedule in ("quintic", "simple"):
        chosen = HeroHyperparameters(**{**settings.__dict__, "newton_schulz_coefficients": schedule})
        update, _ = first_update(chosen, grads, params)
        alone = scale_by_muonh(settings.momentum, 5, settings.muonh_lr, schedule, 1e-8)
        expected, _ = alone.update(grads["proj"], alone.init(params["proj"]), params["proj"])
        np.testing.assert_allclose(update["proj"].weight.array, expected.weight.array, atol=1e-7)
    with pytest.raises(ValueError, match="none of Levanter's"):
        HeroHyperparameters(1e-3, 4e-3, 4e-3, newton_schulz_coefficients="cubic")


def test_the_settings_name_levanters_schedules_and_no_other() -> None:
    """HeroHyperparameters checks a schedule's name without importing Levanter (a DAG's definition does not load
    it): the names it knows are the keys of Levanter's own table, whose triples the optimizer reads."""
    assert NEWTON_SCHULZ_SCHEDULES == tuple(sorted(NEWTON_SCHULZ_COEFFICIENTS))
    for schedule in NEWTON_SCHULZ_SCHEDULES:
        assert HeroHyperparameters(1e-3, 4e-3, 4e-3, newton_schulz_coefficients=schedule).newton_schulz_steps == 5


@pytest.mark.parametrize("max_grad_norm", [None, 1.0])
def test_the_hero_recipe_hands_the_raw_gradient_to_its_groups(max_grad_norm: float | None) -> None:
    """Adam's first moment after one step is (1 - beta1) x the gradient it was handed: the whole gradient
    unclipped (the published hero), or one scaled to the clip's global norm."""
    params = small_model(0)
    grads = jax.tree.map(lambda leaf: 100.0 * leaf, small_model(1))
    settings = HeroHyperparameters(1e-3, 4e-3, 4e-3, max_grad_norm=max_grad_norm)
    _, state = first_update(settings, grads, params)
    moments = [value for _, value in optax.tree_utils.tree_get_all_with_path(state, "mu")]
    adam_moment = next(moment["embeddings"] for moment in moments if isinstance(moment["embeddings"], hax.NamedArray))
    scale = 1.0 if max_grad_norm is None else max_grad_norm / float(optax.global_norm(grads))
    np.testing.assert_allclose(adam_moment.array, (1 - settings.beta1) * scale * grads["embeddings"].array, rtol=1e-5)


def test_hero_without_its_hyperparameters_is_refused() -> None:
    with pytest.raises(ValueError, match="hyperparameters"):
        HeroOptimizerConfig().build(10)
    with pytest.raises(ValueError, match="hero_hyperparameters"):
        levanter_optimizer("hero", learning_rate=1e-3, weight_decay=0.0, warmup=0.1, min_lr_ratio=0.05,
                           lr_schedule="linear", hero=None)  # fmt: skip
    with pytest.raises(ValueError, match="none of"):
        levanter_optimizer("sgd", learning_rate=1e-3, weight_decay=0.0, warmup=0.1, min_lr_ratio=0.05,
                           lr_schedule="linear", hero=HeroHyperparameters(1e-3, 4e-3, 4e-3))  # fmt: skip
