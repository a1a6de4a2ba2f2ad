"""The train step's optimizers: `adamw` (one AdamW over every weight) and the hero's `hero` recipe.

`hero` puts each trained weight in one of three groups, by a mask over the model's tree (`parameter_groups`):

- **muonh**: every matrix of attention, the dense and shared MLPs, the latent projections and the routed experts.
  The update is Nesterov momentum orthogonalised by five Newton-Schulz steps, Levanter's
  `zeropower_via_newtonschulz5` on the coefficient schedule the recipe names (the hero's: "quintic", one
  triple per step from Levanter's `NEWTON_SCHULZ_COEFFICIENTS`, what its `MuonHConfig` runs by default), then
  a *hyperball* step that keeps the matrix's Frobenius norm where it was:
  `p' = p - lr * u * |p| / |u|`, `p'' = p' * |p| / |p'|`. A weight stacked over layers or experts is that
  many matrices (`matrix_view`): the stacked 3-D expert weights are orthogonalised and normalised per expert.
- **adamh**: the lm-head readout: Adam's direction, then the same hyperball step.
- **adam**: the rest (token embeddings, norms, the router's gate, biases), plain Adam at `adam_lr`.

The router bias (steps/model/router_balance.py) is no trained weight: Levanter's train step takes it out of the
gradient before the optimizer sees it (`partition_for_grad_overwrite`), so it is in no group and has no state.
The norm-keeping groups need no weight decay; `hero` decays nothing. The published hero trains unclipped
(`max_grad_norm` None, Marin's "1pct-noclip" schedule); a recipe that sets it clips the gradient to that global
norm before every group. Every learning rate follows the train config's schedule (the hero's:
linear decay to 5% of its peak).

`optimizer_groups(model)` is the mask as `{parameter path: group}`, what the step writes to
`optimizer_groups.json` next to its checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import haliax.quantization as hq
import jax
import jax.numpy as jnp
import optax
from haliax import NamedArray
from levanter.optim.config import AdamConfig, OptimizerConfig
from levanter.optim.util import NEWTON_SCHULZ_COEFFICIENTS

from executor import storage
from steps.train.train_config import HeroHyperparameters, check_optimizer

GROUPS = ("muonh", "adamh", "adam")
OPTIMIZER_GROUPS_FILE = "optimizer_groups.json"


def _is_linear(node: Any) -> bool:
    return isinstance(node, (hnn.Linear, hnn.MoELinear))


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, jax.tree_util.SequenceKey | jax.tree_util.DictKey):
            parts.append(str(key.idx if isinstance(key, jax.tree_util.SequenceKey) else key.key))
    return ".".join(parts)


def _group_of(path: str, node: Any) -> Any:
    """The group label of one module or array at `path` (a linear module: a copy of it holding its labels)."""
    if path.startswith("lm_head"):
        group = "adamh"
    elif path.startswith("embeddings") or path.endswith("mlp.gate"):
        group = "adam"  # token embeddings and the router's gate
    else:
        group = "muonh" if _is_linear(node) else "adam"
    if _is_linear(node):
        return dataclasses.replace(node, weight=group, bias=None if node.bias is None else "adam")
    return group


def parameter_groups(params: Any) -> Any:
    """The mask: `params`' tree with each trained array replaced by its group's name (module docstring)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, node: _group_of(_path_name(path), node),
        params,
        is_leaf=lambda node: _is_linear(node) or isinstance(node, NamedArray),
    )


def optimizer_groups(params: Any) -> dict[str, str]:
    """`{parameter path: group}` for every trained array of `params` (a model, or its shape)."""
    labelled = parameter_groups(params)
    leaves = jax.tree_util.tree_flatten_with_path(labelled, is_leaf=lambda node: isinstance(node, str))[0]
    return {_path_name(path): label for path, label in leaves}


def matrix_view(weight: NamedArray, module: Any) -> tuple[jax.Array, Callable[[jax.Array], NamedArray]]:
    """`weight` of a linear `module` as a stack of matrices (stack, out, in): its input axes are the module's
    `In`, its output axes `Out`, every other axis (stacked layers, experts) indexes the matrices. Also the
    function that puts such a stack back into `weight`'s axes."""
    ins = tuple(hax.axis_name(axis) for axis in _axes(module.In))
    outs = tuple(hax.axis_name(axis) for axis in _axes(module.Out))
    stack = tuple(name for name in weight.axis_names if name not in ins + outs)
    ordered = weight.rearrange((*stack, *outs, *ins))
    sizes = [ordered.axis_size(name) for name in (*stack, *outs, *ins)]
    matrices = ordered.array.reshape(
        math.prod(sizes[: len(stack)]), math.prod(sizes[len(stack) : len(stack) + len(outs)]), -1
    )

    def back(array: jax.Array) -> NamedArray:
        return hax.named(array.reshape(sizes), ordered.axes).rearrange(weight.axes)

    return matrices, back


def _axes(spec: Any) -> tuple[Any, ...]:
    return tuple(spec) if isinstance(spec, tuple | list) else (spec,)


def newton_schulz(matrix: jax.Array, steps: int, coefficients: str, eps: float) -> jax.Array:
    """Levanter's Newton-Schulz iteration (`zeropower_via_newtonschulz5`) towards the orthogonal factor U V^T of
    one 2-D `matrix` = U S V^T: `steps` steps, step i on the i-th (a, b, c) of Levanter's `coefficients` schedule,
    X <- a X + (b A + c A^2) X with A = X X^T, in float32. Its result's singular values end near 1, not at 1:
    five "quintic" steps leave them in about [0.98, 1.03], five "simple" ones in [0.68, 1.13].

    The same arithmetic in the same order as Levanter's function, less its sharding constraint, which names mesh
    axes ("data", "model") that the plan's meshes need not have: the matrices stay laid out as the plan put them.
    """
    table = NEWTON_SCHULZ_COEFFICIENTS[coefficients]
    x = matrix.astype(jnp.float32)
    x = x / (jnp.linalg.norm(x) + eps)
    wide = x.shape[0] > x.shape[1]
    if wide:
        x = x.T  # iterate on the side whose Gram matrix is the smaller
    for step in range(steps):
        a, b, c = table[step % len(table)]
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if wide else x).astype(matrix.dtype)


def hyperball_step(param: jax.Array, direction: jax.Array, learning_rate: jax.Array | float) -> jax.Array:
    """The update taking each matrix `param[i]` a step of `learning_rate` times its norm along `direction[i]`,
    back onto the sphere of its norm (arrays of shape (stack, out, in))."""

    def norm(matrices: jax.Array) -> jax.Array:
        return jnp.linalg.norm(matrices, axis=(-2, -1), keepdims=True)

    moved = param - learning_rate * direction * norm(param) / (norm(direction) + 1e-12)
    return moved * norm(param) / (norm(moved) + 1e-12) - param


def _map_matrices(fn: Callable[..., jax.Array], *trees: Any) -> Any:
    """Apply `fn(stacks...)` to each linear module's weight in `trees` (same structure, masked entries skipped),
    as matrix stacks (`matrix_view`), and put the result back into the weight's axes."""

    def per_module(*modules: Any) -> Any:
        if not _is_linear(modules[0]) or not isinstance(modules[0].weight, NamedArray):
            return modules[0]
        views = [matrix_view(module.weight, module) for module in modules]
        result = views[0][1](fn(*(matrices for matrices, _ in views)))
        return dataclasses.replace(modules[0], weight=result)

    return jax.tree.map(per_module, *trees, is_leaf=_is_linear)


class MuonHState(NamedTuple):
    momentum: optax.Updates


def scale_by_muonh(
    momentum: float, steps: int, learning_rate: Any, coefficients: str = "quintic", eps: float = 1e-8
) -> optax.GradientTransformation:
    """MuonH's update (module docstring): Nesterov momentum, orthogonalised per matrix by `steps` Newton-Schulz
    steps on the `coefficients` schedule, then the hyperball step."""

    def orthogonalise(stack: jax.Array) -> jax.Array:
        return jax.vmap(lambda matrix: newton_schulz(matrix, steps, coefficients, eps))(stack)

    def init(params: Any) -> MuonHState:
        return MuonHState(optax.tree_utils.tree_zeros_like(params))

    def update(updates: Any, state: MuonHState, params: Any = None) -> tuple[Any, MuonHState]:
        buffer = jax.tree.map(lambda m, g: momentum * m + g, state.momentum, updates)
        nesterov = jax.tree.map(lambda m, g: momentum * m + g, buffer, updates)
        orthogonal = _map_matrices(orthogonalise, nesterov)
        step = _map_matrices(lambda p, u: hyperball_step(p, u, learning_rate), params, orthogonal)
        return step, MuonHState(buffer)

    return optax.GradientTransformation(init, update)


def scale_by_adamh(beta1: float, beta2: float, epsilon: float, learning_rate: Any) -> optax.GradientTransformation:
    """AdamH: Adam's bias-corrected direction, then the hyperball step, per matrix."""
    adam = optax.scale_by_adam(beta1, beta2, epsilon)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        direction, state = adam.update(updates, state, params)
        return _map_matrices(lambda p, u: hyperball_step(p, u, learning_rate), params, direction), state

    return optax.GradientTransformation(adam.init, update)


@OptimizerConfig.register_subclass("hero")
@dataclass(frozen=True)
class HeroOptimizerConfig(OptimizerConfig):
    """Levanter's optimizer config for `hero`: MuonH / AdamH / Adam by `parameter_groups`, each group's peak
    rate on the shared schedule (warmup, decay to `min_lr_ratio`, `lr_schedule`)."""

    hyperparameters: HeroHyperparameters | None = None

    def build(self, num_train_steps: int) -> optax.GradientTransformation:
        settings = self.hyperparameters
        if settings is None:
            raise ValueError("the hero optimizer needs its hyperparameters (`MoeHeuristic`)")
        schedules = {
            name: self.lr_scheduler(num_train_steps, override_lr=rate)
            for name, rate in (("muonh_lr", settings.muonh_lr), ("adamh_lr", settings.adamh_lr),
                               ("adam_lr", settings.adam_lr))
        }  # fmt: skip

        def optimizer(muonh_lr: Any, adamh_lr: Any, adam_lr: Any) -> optax.GradientTransformation:
            groups = {
                "muonh": scale_by_muonh(settings.momentum, settings.newton_schulz_steps, muonh_lr,
                                        settings.newton_schulz_coefficients, settings.newton_schulz_epsilon),
                "adamh": scale_by_adamh(settings.beta1, settings.beta2, settings.epsilon, adamh_lr),
                "adam": optax.chain(optax.scale_by_adam(settings.beta1, settings.beta2, settings.epsilon),
                                    optax.scale(-adam_lr)),
            }  # fmt: skip
            clip = [] if settings.max_grad_norm is None else [optax.clip_by_global_norm(settings.max_grad_norm)]
            return optax.chain(*clip, optax.multi_transform(groups, parameter_groups))

        return optax.inject_hyperparams(optimizer)(**schedules)


def levanter_optimizer(
    name: str,
    *,
    learning_rate: float,
    weight_decay: float,
    warmup: float,
    min_lr_ratio: float,
    lr_schedule: str,
    hero: HeroHyperparameters | None,
) -> OptimizerConfig:
    """The train config's optimizer as Levanter's: `adamw` at `learning_rate` with `weight_decay`, or `hero`
    with `hero`'s rates (`learning_rate` and `weight_decay` unused); both on the same schedule."""
    check_optimizer(name, hero)
    schedule = {"warmup": warmup, "min_lr_ratio": min_lr_ratio, "lr_schedule": lr_schedule}
    if name == "adamw":
        return AdamConfig(learning_rate=learning_rate, weight_decay=weight_decay, **schedule)
    assert hero is not None  # check_optimizer: "hero" has its settings
    return HeroOptimizerConfig(learning_rate=hero.muonh_lr, weight_decay=0.0, hyperparameters=hero, **schedule)


def write_optimizer_groups(output_path: str, optimizer: str, build_model: Callable[[], Any]) -> dict[str, str]:
    """Write `optimizer_groups.json` under `output_path`: `optimizer`'s groups over the model `build_model` builds
    (only its shapes are computed), as `{parameter path: group}` (every one "adamw" under AdamW), with each
    group's parameter count."""
    model = eqx.filter_eval_shape(build_model)
    _, trained = hq.partition_for_grad_overwrite(model)

    def is_float(leaf: Any) -> bool:
        return isinstance(leaf, jax.ShapeDtypeStruct) and jnp.issubdtype(leaf.dtype, jnp.inexact)

    trained = eqx.filter(trained, is_float)
    groups = optimizer_groups(trained)
    if optimizer == "adamw":
        groups = dict.fromkeys(groups, "adamw")
    counts = dict.fromkeys(sorted(set(groups.values())), 0)
    for path, leaf in jax.tree_util.tree_flatten_with_path(trained)[0]:
        counts[groups[_path_name(path)]] += math.prod(leaf.shape)
    record = {"optimizer": optimizer, "groups": groups, "parameters": counts}
    storage.write_json_atomic(storage.join(output_path, OPTIMIZER_GROUPS_FILE), record)
    return groups
