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

OPTIMIZERS = ("adamw", "hero")
"""`TrainConfig.optimizer`'s choices."""
GROUPS = ("muonh", "adamh", "adam")
OPTIMIZER_GROUPS_FILE = "optimizer_groups.json"


@dataclass(frozen=True)
class HeroHyperparameters:
    """The `hero` optimizer's settings (`MoeHeuristic` derives them from a run's compute). Versioned."""

    adam_lr: float
    """Peak learning rate of the Adam group."""
    muonh_lr: float
    """Peak step of the MuonH group, as a share of each matrix's norm."""
    adamh_lr: float
    """Peak step of the AdamH readout, as a share of its norm."""
    beta1: float = 0.9062
    """Adam's and AdamH's first-moment decay."""
    beta2: float = 0.95
    """Adam's and AdamH's second-moment decay."""
    epsilon: float = 1e-8
    """Adam's and AdamH's denominator epsilon."""
    momentum: float = 0.95
    """MuonH's (Nesterov) momentum."""
    newton_schulz_steps: int = 5
    """Newton-Schulz steps of each MuonH update."""
    newton_schulz_coefficients: str = "quintic"
    """Which of Levanter's `NEWTON_SCHULZ_COEFFICIENTS` schedules the steps take their (a, b, c) from, step i
    the i-th triple (cyclically): "quintic" (the hero's, Levanter's default: five triples), "simple" (one
    triple, Muon's), "polar_express" or "aol"."""
    newton_schulz_epsilon: float = 1e-8
    """Added to the Frobenius norm each matrix is divided by before the iteration (Levanter's `muon_epsilon`)."""
    max_grad_norm: float | None = None
    """Global gradient-norm clip before every group (None, the published hero's: none)."""

    def __post_init__(self) -> None:
        if self.newton_schulz_coefficients not in NEWTON_SCHULZ_COEFFICIENTS:
            raise ValueError(
                f"newton_schulz_coefficients={self.newton_schulz_coefficients!r} is none of Levanter's "
                f"{sorted(NEWTON_SCHULZ_COEFFICIENTS)}"
            )


@dataclass(frozen=True)
class MoeHeuristic:
    """Optimizer hyperparameters from a run's compute: the hero's heuristic (marin issue #8435), its constants
    overridable. Versioned through what it derives.

    Each rung of a ladder and the hero get their own rates, epsilon and beta2 from their own token budget `T`,
    batch `B` (tokens per step) and width `d` (d_model), by one formula family:

        rate     = 0.06602 * T^-0.395 * d^-0.150 * sqrt(B)
        adam_lr  = min(rate, 0.05)
        muonh_lr = adamh_lr = min(13/3 * rate, 0.05)
        epsilon  = 9.676e-18 * sqrt(T / B)
        beta2    = clip(0.999^(B / 131072), 0.95, 0.9999),  beta1 = 0.9062

    with a linear decay to 5% of the peak. The cap holds every group's rate, as published: the MuonH and AdamH
    rates reach it first (at the tiny hero's d768 rung, 13/3 x 0.01226 = 0.0531 is trained at 0.05). The
    constants are Marin's published ones; a refit is a new `version` (and so a new hash for every run that uses
    it: the derived figures are what the train steps hash).
    For example a run of 2^30 tokens in steps of 2^20 at d_model 2048 gets adam_lr 0.00584, muonh_lr 0.0253,
    beta2 0.9920 and epsilon 3.1e-16: `MoeHeuristic().hyperparameters(2**30, 2**20, 2048)`.
    """

    version: str = "marin-8435"
    """Which constants these are; change it with any constant."""
    lr_coefficient: float = 0.06602
    tokens_exponent: float = -0.395
    width_exponent: float = -0.150
    max_lr: float = 0.05
    """The highest peak rate of any group (Adam's, MuonH's and AdamH's alike)."""
    muonh_over_adam: float = 13 / 3
    epsilon_coefficient: float = 9.676e-18
    beta2_base: float = 0.999
    beta2_reference_batch: int = 131_072
    """Tokens per step at which beta2 is `beta2_base`; beta2 is per token, so a batch of B tokens takes its
    B / reference-th power."""
    beta2_range: tuple[float, float] = (0.95, 0.9999)
    beta1: float = 0.9062
    min_lr_ratio: float = 0.05
    """The linear decay's end, over the peak."""
    lr_schedule: str = "linear"

    def uncapped_adam_lr(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> float:
        """The formula's Adam rate before the cap (`max_lr`)."""
        rate = self.lr_coefficient * tokens**self.tokens_exponent * hidden_dim**self.width_exponent
        return rate * math.sqrt(tokens_per_batch)

    def hyperparameters(self, tokens: float, tokens_per_batch: float, hidden_dim: int) -> HeroHyperparameters:
        """The hero optimizer's settings for a run of `tokens` tokens in steps of `tokens_per_batch`, width
        `hidden_dim`."""
        if tokens <= 0 or tokens_per_batch <= 0 or hidden_dim <= 0:
            raise ValueError(
                f"MoeHeuristic needs positive tokens, batch and width, got tokens={tokens}, "
                f"tokens_per_batch={tokens_per_batch}, hidden_dim={hidden_dim}"
            )
        rate = self.uncapped_adam_lr(tokens, tokens_per_batch, hidden_dim)
        matrix_rate = min(self.muonh_over_adam * rate, self.max_lr)
        low, high = self.beta2_range
        return HeroHyperparameters(
            adam_lr=min(rate, self.max_lr),
            muonh_lr=matrix_rate,
            adamh_lr=matrix_rate,
            beta1=self.beta1,
            beta2=min(max(self.beta2_base ** (tokens_per_batch / self.beta2_reference_batch), low), high),
            epsilon=self.epsilon_coefficient * math.sqrt(tokens / tokens_per_batch),
        )


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
    schedule = {"warmup": warmup, "min_lr_ratio": min_lr_ratio, "lr_schedule": lr_schedule}
    if name == "adamw":
        return AdamConfig(learning_rate=learning_rate, weight_decay=weight_decay, **schedule)
    if name == "hero":
        if hero is None:
            raise ValueError("optimizer='hero' needs hero_hyperparameters (`MoeHeuristic` derives them)")
        return HeroOptimizerConfig(learning_rate=hero.muonh_lr, weight_decay=0.0, hyperparameters=hero, **schedule)
    raise ValueError(f"optimizer={name!r} is none of {OPTIMIZERS}")


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
