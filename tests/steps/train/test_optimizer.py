"""The hero optimizer (steps/train/optimizer.py) against hand-written references, on the hero-shaped tiny model.

A MuonH step of one matrix is the quintic Newton-Schulz iteration, written here again in float64 NumPy, followed
by the hyperball step; each matrix of a stack (layers, experts) is orthogonalised and kept at its norm on its own;
the mask puts every trained parameter of the tiny hero model in exactly one group, and the router bias in none.
"""

from __future__ import annotations

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import haliax.quantization as hq
import jax
import numpy as np
import optax
import pytest
from levanter.models.lm_model import LmExample
from levanter.trainer_state import TrainerState

from experiments.hero_535b import tiny_shape
from steps.model.levanter_config import qwen3_moe_config
from steps.model.router_balance import is_router_state
from steps.train.memory_model import optimizer_groups as planned_groups
from steps.train.optimizer import (
    GROUPS,
    HeroHyperparameters,
    HeroOptimizerConfig,
    MoeHeuristic,
    levanter_optimizer,
    optimizer_groups,
    parameter_groups,
    scale_by_adamh,
    scale_by_muonh,
)

VOCAB = 128
In, Out, Experts = hax.Axis("in", 24), hax.Axis("out", 40), hax.Axis("experts", 4)


def reference_newton_schulz(matrix: np.ndarray, steps: int = 5) -> np.ndarray:
    """Five quintic steps, X <- 3.4445 X - 4.7750 (X X^T) X + 2.0315 (X X^T)^2 X, on the short side."""
    x = np.asarray(matrix, dtype=np.float64)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = 3.4445 * x - 4.7750 * gram @ x + 2.0315 * gram @ gram @ x
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


def test_the_muonh_update_of_one_matrix_is_newton_schulz_then_the_hyperball_step() -> None:
    param, grad = linear(0), random_like(linear(0), 1)
    rate = 0.05
    muonh = scale_by_muonh(momentum=0.95, steps=5, learning_rate=rate)
    update, _ = muonh.update(grad, muonh.init(param), param)
    # The first step's Nesterov direction is (1 + momentum) x the gradient, which the iteration normalises away.
    orthogonal = reference_newton_schulz(1.95 * matrices(grad.weight))
    expected = reference_hyperball(matrices(param.weight), orthogonal, rate) - matrices(param.weight)
    np.testing.assert_allclose(matrices(update.weight), expected, atol=1e-5)
    singular = np.linalg.svd(orthogonal, compute_uv=False)
    assert 0.6 < singular.min() and singular.max() < 1.3  # the quintic's band around 1, not exactly 1


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
        direction = reference_newton_schulz(1.95 * grads[expert])
        expected = reference_hyperball(weights[expert], direction, rate) - weights[expert]
        np.testing.assert_allclose(got[expert], expected, atol=1e-5)
    # Orthogonalising the experts as one (experts x out, in) matrix would be another update.
    whole = reference_newton_schulz(1.95 * grads.reshape(-1, In.size)).reshape(grads.shape)
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
    assert heuristic.hyperparameters(1e3, 1e6, 8).adam_lr == 0.05  # capped
    with pytest.raises(ValueError, match="positive tokens"):
        heuristic.hyperparameters(0, 512, 32)


def test_hero_without_its_hyperparameters_is_refused() -> None:
    with pytest.raises(ValueError, match="hyperparameters"):
        HeroOptimizerConfig().build(10)
    with pytest.raises(ValueError, match="hero_hyperparameters"):
        levanter_optimizer("hero", learning_rate=1e-3, weight_decay=0.0, warmup=0.1, min_lr_ratio=0.05,
                           lr_schedule="linear", hero=None)  # fmt: skip
    with pytest.raises(ValueError, match="none of"):
        levanter_optimizer("sgd", learning_rate=1e-3, weight_decay=0.0, warmup=0.1, min_lr_ratio=0.05,
                           lr_schedule="linear", hero=HeroHyperparameters(1e-3, 4e-3, 4e-3))  # fmt: skip
