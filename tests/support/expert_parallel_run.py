"""Run by test_expert_parallel.py (tests/steps/model) and benchmarks/bench_train.py in a subprocess, N fake CPU devices:
five AdamW steps of a tiny hero-shaped MoE through Levanter's own `Trainer` on the layout the train step gives it
(`trainer_mesh`: one device, or data=2 x expert=2 with dense weights split over every device); prints the losses,
the bytes of routed expert weights each device holds, the compiled step's collectives and the least an
expert-parallel step moves (`minimum_collective_bytes`), as JSON.

    python tests/support/expert_parallel_run.py 4 [capacity_factor]     # default: dropless
    python tests/support/expert_parallel_run.py 4 layout                # `layout_runs`
    python tests/support/expert_parallel_run.py 4 both                  # `run(1.15)` and `layout_runs`, one process

The step compiled is the trainer's own jitted train step (gradient under the compute mapping, optimizer update,
state laid out by the parameter mapping), so its collectives are those the train step runs. `layout` trains the
hero-shaped MoE and one whose routed experts read d_model (no latent) a few steps on data=1 x expert=4 and
data=2 x expert=2 (one device: without a mesh), and reports the losses and, for every array of the weights,
their AdamW moments and the step's gradients, its shape and the shape of the part one device holds."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from executor.run.collector import collect_rarely
from executor.run.cpu_devices import UNOPTIMIZED_XLA_FLAG, with_stand_in_flags

DEVICES = int(sys.argv[1])
# Expert parallelism against one device, both compiled alike: LLVM at -O0 (less CPU, same arithmetic).
os.environ["XLA_FLAGS"] = with_stand_in_flags(
    f"--xla_force_host_platform_device_count={DEVICES} {UNOPTIMIZED_XLA_FLAG}"
)

import haliax as hax  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from levanter.callbacks import JitCallback  # noqa: E402
from levanter.models.lm_model import LmExample  # noqa: E402
from levanter.optim.config import AdamConfig  # noqa: E402
from levanter.trainer import Trainer, TrainerConfig  # noqa: E402
from scratch_trainer import scratch_trainer_config  # noqa: E402

from steps.model.levanter_config import qwen3_moe_config, trainer_mesh  # noqa: E402
from steps.model.model_size import MoeShape  # noqa: E402
from steps.model.moe_model import MoeConfig  # noqa: E402

STEPS, BATCH, VOCAB = 5, 8, 128
SHAPE = MoeShape(d_model=32, n_layers=2, vocab_size=VOCAB, n_heads=4, head_dim=8, kv_heads_local=2,
                 kv_heads_global=1, global_every=2, sliding_window=8, n_experts=8, top_k=2, expert_width=16,
                 latent_dim=16, n_shared_experts=2, shared_width=16, seq_len=32)  # fmt: skip
MESH = {"data": 2, "expert": 2}
LAYOUT_SHAPES = {"latent": SHAPE, "plain": dataclasses.replace(SHAPE, latent_dim=None)}
LAYOUT_CASES = (
    ({"data": 1, "expert": 4}, "latent"),
    ({"data": 2, "expert": 2}, "plain"),
    ({"domain": 2, "data": 1, "expert": 2}, "plain"),
)
"""Each mesh once and each model once: the plain model's routed experts read d_model, which meets `experts` only
where `data` (FSDP) is more than one device. The last is two racks of two devices (data parallel across them,
expert parallel inside each): the layout of data=2 x expert=2 with its data axis named for the racks."""
LAYOUT_STEPS = 3
Batch, Vocab = hax.Axis("batch", BATCH), hax.Axis("vocab", VOCAB)


def config(capacity_factor: float | None, shape: MoeShape = SHAPE) -> MoeConfig:
    """The MoE as the train step builds it for `shape` (`qwen3_moe_config`), hero-style routing."""
    return qwen3_moe_config(shape, tokenizer_path="unused", router_aux_loss_coef=None, step="expert_parallel_run",
                            router_bias_balancing=True, router_z_loss_weight=1e-3, capacity_factor=capacity_factor,
                            router_combine="sigmoid", router_combine_sum=2.5)  # fmt: skip


def batches() -> list[LmExample]:
    keys = jax.random.split(jax.random.PRNGKey(7), STEPS)
    position = hax.Axis("position", SHAPE.seq_len)
    return [hax.vmap(LmExample.causal, Batch)(hax.random.randint(key, (Batch, position), 0, VOCAB)) for key in keys]


def trainer_config(scratch: str, mesh: dict[str, int] | None, shape: MoeShape) -> TrainerConfig:
    """Levanter's trainer as steps/train/train.py configures it, for this run's devices."""
    return scratch_trainer_config(scratch, "expert-parallel-run", trainer_mesh(mesh, shape, DEVICES), BATCH, STEPS)


def collectives(hlo: str) -> list[dict[str, Any]]:
    """One entry per array a collective of `hlo` moves (XLA combines several into one op with a tuple result),
    with the number of devices in its groups: XLA keeps collectives over mesh axes of size 1 (`model`,
    `replica`: a psum inside `shard_map`), which move nothing."""
    op = re.compile(r"= (\([^()]*\)|[a-z0-9]+\[[0-9,]*\]\S*) (all-gather|all-to-all|all-reduce|reduce-scatter|"
                    r"collective-permute)(?:-start)?\(")  # fmt: skip
    found = []
    for line in hlo.splitlines():
        match = op.search(line)
        if match:
            shapes = re.findall(r"[a-z0-9]+\[[0-9,]*\]", match.group(1))
            found += [{"op": match.group(2), "shape": shape, "group": group_size(line)} for shape in shapes]
    return found


def group_size(line: str) -> int:
    """Devices per replica group of the collective on HLO `line`, in any of XLA's three notations."""
    named = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
    if named:
        sizes = {name: int(size) for name, size in re.findall(r"'([^']+)'=(\d+)", named.group(1))}
        return math.prod(sizes[name.strip("'")] for name in named.group(2).split(","))
    iota = re.search(r"replica_groups=\[\d+,(\d+)\]<=", line)
    if iota:
        return int(iota.group(1))
    listed = re.search(r"replica_groups=\{\{([^}]*)\}", line)
    return len(listed.group(1).split(",")) if listed else DEVICES


def minimum_collective_bytes(model: object) -> dict[str, int]:
    """The least an expert-parallel step moves, by kind, in the units `collectives` counts (each op's result on
    one device):

    - the routed copies' all-to-alls (to the experts and back, forward and backward), exactly tokens x K rows;
    - each weight split over devices gathered once to what a device computes with (a routed expert's local
      experts whole, any other weight whole; no rematerialisation here), and its gradient reduce-scattered
      back to its shard over the token axes it is split over;
    - the gradient of a weight (or of its shard) that is the same on several devices holding different tokens,
      all-reduced over them: the router bias and loads are split over `expert` only, the same on both `data`
      devices (`all-reduce of shards`), a leaf held whole is the same everywhere (`all-reduce`). Dense weights
      are split over every device, so theirs is a reduce-scatter alone; a routed expert's gradient sums only
      over `data`: its tokens reach it by the all-to-all."""
    copies = BATCH * SHAPE.seq_len // DEVICES * SHAPE.top_k
    feature = SHAPE.latent_dim or SHAPE.d_model
    minimum = {"all-to-all": 4 * SHAPE.n_layers * copies * feature * 4, "all-gather": 0, "reduce-scatter": 0,
               "all-reduce of shards": 0, "all-reduce": 0}  # fmt: skip
    for path, leaf in jax.tree_util.tree_leaves_with_path(model):
        if not isinstance(leaf, jax.Array):
            continue
        held = leaf.addressable_shards[0].data.nbytes
        routed = ".experts." in jax.tree_util.keystr(path)
        needed = leaf.nbytes // MESH["expert"] if routed else leaf.nbytes
        split = set(jax.tree.leaves(tuple(leaf.sharding.spec)))  # type: ignore[attr-defined]
        summed = {"data"} if routed else set(MESH)
        if held < needed:
            minimum["all-gather"] += needed
        if split & summed:
            minimum["reduce-scatter"] += held
        if summed - split:
            minimum["all-reduce" if held == leaf.nbytes else "all-reduce of shards"] += held
    return minimum


@contextmanager
def training(
    model_config: MoeConfig, mesh: dict[str, int] | None, shape: MoeShape, hooks: Sequence[JitCallback] = ()
) -> Iterator[tuple[Trainer, Any, list[LmExample]]]:
    """Levanter's trainer for `model_config` on `mesh`, with `hooks` every step; its initial state and the batches,
    laid out by the trainer's mappings."""
    optimizer = AdamConfig(learning_rate=1e-2, weight_decay=0.1, warmup=0.0, lr_schedule="constant").build(STEPS)

    def loss_function(model, example: LmExample, *, key=None):  # train_lm's, without its logsumexp term
        return model.compute_next_token_loss(example, key=key)

    with tempfile.TemporaryDirectory(prefix="expert-parallel-run-") as scratch:
        trainer = Trainer(trainer_config(scratch, mesh, shape), optimizer, loss_function, add_default_hooks=False)
        for hook in hooks:
            trainer.add_hook(hook, every=1)
        with trainer:
            state = trainer.initial_state(
                jax.random.PRNGKey(1), model_init=lambda: model_config.build(Vocab, key=jax.random.PRNGKey(0))
            )
            yield trainer, state, [hax.shard(example, trainer.compute_axis_mapping) for example in batches()]


def run(capacity_factor: float | None) -> dict:
    with training(config(capacity_factor), MESH if DEVICES > 1 else None, SHAPE) as (trainer, state, examples):
        hlo, minimum = "", {}
        if DEVICES > 1:  # one device has no collectives: its step is compiled once, by training
            # The trainer's jitted step without hooks: what `train_step` runs when no hook is due.
            hlo = trainer._jit_train_step_fn_no_hook.lower(state, (examples[0],), {}).compile().as_text()
            minimum = minimum_collective_bytes(state.model)
        losses = []
        for example in examples:
            info = trainer.train_step(state, example)
            state = info.state
            losses.append(float(info.loss))
        experts = state.model.transformer.periods.stacked.global_layer.mlp.experts.gate_proj.weight.array
        expert_bytes_per_device = experts.addressable_shards[0].data.nbytes
    return {
        "minimum_collective_bytes": sum(minimum.values()),
        "minimum_by_kind": minimum,
        "losses": losses,
        "expert_bytes_per_device": expert_bytes_per_device,
        "expert_bytes": experts.nbytes,
        "collectives": collectives(hlo),
    }


def layout(tree: Any) -> dict[str, list[list[int]]]:
    """Every array of `tree` by its path: [its shape, the shape of the part each device holds]."""
    return {
        jax.tree_util.keystr(path).removesuffix("[<flat index 0>]"): [
            list(leaf.shape),
            list(leaf.sharding.shard_shape(leaf.shape)),
        ]
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if isinstance(leaf, jax.Array)
    }


class GradientLayout(JitCallback):
    """The layout of the gradients the trainer's jitted step hands its hooks (as Levanter's watch gets them), on
    the first step."""

    def __init__(self) -> None:
        self.gradients: dict[str, list[list[int]]] = {}

    def inside_step(self, state: Any, inside_info: Any) -> Any:
        return inside_info.grads

    def on_step(self, step_info: Any, cb_info: Any) -> None:
        self.gradients = self.gradients or layout(cb_info)


def layout_runs(skip: Sequence[str] = ()) -> list[dict]:
    """`LAYOUT_STEPS` steps of each of `LAYOUT_CASES` (one device: each of `LAYOUT_SHAPES` but `skip`, without a
    mesh): the losses and the layouts of the weights, their AdamW moments (`mu`, `nu`) and the first step's
    gradients."""
    runs = []
    cases = LAYOUT_CASES if DEVICES > 1 else tuple((None, name) for name in LAYOUT_SHAPES if name not in skip)
    for mesh, name in cases:
        shape, hook = LAYOUT_SHAPES[name], GradientLayout()
        with training(config(1.15, shape), mesh, shape, [hook]) as (trainer, state, examples):
            adam = jax.tree.leaves(state.opt_state, is_leaf=lambda node: hasattr(node, "mu"))
            moments = next(node for node in adam if hasattr(node, "mu"))
            found = {"params": layout(state.model), "mu": layout(moments.mu), "nu": layout(moments.nu)}
            losses = []
            for example in examples[:LAYOUT_STEPS]:
                info = trainer.train_step(state, example)
                state = info.state
                losses.append(float(info.loss))
            if mesh and "domain" in mesh:
                found["racks"] = racks(trainer, state, examples[0])
        runs.append({"mesh": mesh, "model": name, "losses": losses, **found, "grads": hook.gradients})
    return runs


def racks(trainer: Trainer, state: Any, example: LmExample) -> dict[str, Any]:
    """A mesh with domains: its axis names, the devices of each domain, the batch's mesh axes, and every
    all-to-all of the compiled train step with its shapes and its groups of devices."""
    mesh = trainer.device_mesh
    names = list(mesh.axis_names)
    by_domain = np.moveaxis(np.vectorize(lambda device: device.id)(mesh.devices), names.index("domain"), 0)
    hlo = trainer._jit_train_step_fn_no_hook.lower(state, (example,), {}).compile().as_text()
    return {
        "axis_names": names,
        "domains": [sorted(int(i) for i in block.flat) for block in by_domain],
        "batch_axes": list(jax.tree.leaves(tuple(example.tokens.array.sharding.spec))),
        "all_to_all": all_to_all_groups(hlo, mesh),
    }


def all_to_all_groups(hlo: str, mesh: Any) -> list[dict[str, Any]]:
    """Each all-to-all of `hlo`: the shapes it moves and its groups as lists of device ids, from any of XLA's three
    replica-group notations (a named-mesh group lists the axes it spans; an iota or listed one, positions in the
    mesh's device order)."""
    ids = np.vectorize(lambda device: device.id)(mesh.devices)
    found = []
    for line in hlo.splitlines():
        match = re.search(r"= (\([^()]*\)|[a-z0-9]+\[[0-9,]*\]\S*) all-to-all(?:-start)?\(", line)
        if not match:
            continue
        named = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
        iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", line)
        listed = re.search(r"replica_groups=\{(\{[^=]*\})\}", line)
        if named:
            axes = [(axis, int(size)) for axis, size in re.findall(r"'([^']+)'=(\d+)", named.group(1))]
            spanned = [axis.strip("'") for axis in named.group(2).split(",")]
            grid = ids.reshape([size for _, size in axes])
            moved = np.moveaxis(grid, [[a for a, _ in axes].index(axis) for axis in spanned], range(-len(spanned), 0))
            groups = moved.reshape(-1, math.prod(size for axis, size in axes if axis in spanned))
        elif iota:
            count, size, dims = int(iota.group(1)), int(iota.group(2)), [int(d) for d in iota.group(3).split(",")]
            positions = np.arange(math.prod(dims)).reshape(dims)
            if iota.group(4):
                positions = positions.transpose([int(d) for d in iota.group(4).split(",")])
            groups = ids.flat[positions.reshape(count, size)]
        elif listed:
            groups = np.array([ids.flat[[int(i) for i in group.split(",")]]
                               for group in re.findall(r"\{([0-9,]+)\}", listed.group(1))])  # fmt: skip
        else:
            groups = ids.reshape(1, -1)
        shapes = re.findall(r"[a-z0-9]+\[[0-9,]*\]", match.group(1))
        found.append({"shapes": shapes, "groups": sorted(sorted(int(i) for i in group) for group in groups)})
    return found


def both_runs() -> dict:
    """`run(1.15)` and `layout_runs()` in one process (one start of JAX and Levanter). One device trains the
    latent model once: `run`'s first `LAYOUT_STEPS` losses are its layout run's (one device has no layout)."""
    hero = run(1.15)
    layouts = layout_runs(skip=("latent",) if DEVICES == 1 else ())
    if DEVICES == 1:
        layouts.insert(0, {"mesh": None, "model": "latent", "losses": hero["losses"][:LAYOUT_STEPS]})
    return {"run": hero, "layout": layouts}


if __name__ == "__main__":
    collect_rarely()
    if sys.argv[2:] == ["layout"]:
        print("RESULT " + json.dumps(layout_runs()))
    elif sys.argv[2:] == ["both"]:
        print("RESULT " + json.dumps(both_runs()))
    else:
        print("RESULT " + json.dumps(run(float(sys.argv[2]) if len(sys.argv) > 2 else None)))
