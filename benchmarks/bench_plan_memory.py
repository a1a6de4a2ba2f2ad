"""The memory plan against the compiled program: `memory_per_device` over XLA's `memory_analysis()`, per shape.

Each probe (`MemoryProbe`) is a scaled-down run with the hero's features: sliding-window local
layers and global layers with their own KV widths (every 4th global), latent routed experts, two shared experts,
router-bias balancing and the sigmoid combine; it varies what the plan prices: expert capacity or dropless, remat
none / per layer / per period, microbatches, 1, 2 and 4 fake CPU devices on a data x expert mesh, train and eval,
AdamW and the hero's `hero` optimizer (its groups' state and the Newton-Schulz temporaries).
The plan's figure (steps/train/memory_model.py, f32, attention scores materialised as XLA's CPU attention does)
is divided by the compiled program's arguments + outputs + temporaries - aliased bytes, one device: for training
Levanter's own train step (`Trainer._jit_train_step_fn_no_hook`: microbatched loss and gradient, the optimizer's
update, the state donated) on the probe's batch and microbatch; for eval the evaluate step's per-position loss on one
eval batch, the model in inference mode. The model is the real one, laid out as the train step lays it out
(steps/model/levanter_config.py `trainer_mesh`), compiled without running; its train state is zeros on the layout
`Trainer.initial_state` gives it (`state_laid_out`: the program reads only shapes, dtypes and shardings).
A ratio above 1 is a plan that over-reserves; below 1, one that would run out of memory.

    .venv/bin/python benchmarks/bench_plan_memory.py            # every probe, a few minutes
    .venv/bin/python benchmarks/bench_plan_memory.py --only ep  # the probes whose name holds "ep"

Each device count compiles in a process of its own (JAX fixes its CPU device count when it loads). The last
line printed is one JSON object: every probe's measured and planned bytes and ratio, and the worst ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import record  # noqa: E402

from executor.run.collector import collect_rarely  # noqa: E402
from executor.run.cpu_devices import UNOPTIMIZED_XLA_FLAG, with_stand_in_flags  # noqa: E402
from steps.model.model_size import MoeShape  # noqa: E402
from steps.train.memory_model import memory_per_device  # noqa: E402


@dataclass(frozen=True)
class MemoryProbe:
    """One scaled-down run to compile: the model, its layout and its settings (the hero recipe's routing)."""

    name: str
    shape: MoeShape
    mesh: dict[str, int] = field(default_factory=lambda: {"data": 1})
    batch_size: int = 8
    """Sequences per step (train) or per eval batch (eval), over all devices."""
    microbatch: int | None = None
    """Sequences per device per pass (None: the whole per-device batch)."""
    remat: str = "layer"
    capacity_factor: float | None = 1.15
    training: bool = True
    compute_dtype: str = "float32"
    optimizer: str = "adamw"
    """"adamw" or the hero's "hero" (steps/train/optimizer.py: MuonH / AdamH / Adam, Newton-Schulz temporaries)."""

    @property
    def devices(self) -> int:
        size = 1
        for axis in self.mesh.values():
            size *= axis
        return size

    @property
    def per_device_microbatch(self) -> int:
        return self.batch_size // self.devices if self.microbatch is None else self.microbatch


def compiled_memory(probe: MemoryProbe) -> dict[str, int]:
    """The compiled program's bytes per device (module docstring), by part and in `total`."""
    import haliax as hax
    import jax.numpy as jnp
    from levanter.models.lm_model import LmExample
    from levanter.utils.tree_utils import inference_mode

    from steps.evaluate.evaluate import _per_position_loss

    trainer, model_config, model_init = probe_trainer(probe)
    with trainer:
        state = state_laid_out(trainer, model_init)
        batch = hax.Axis("batch", probe.batch_size)
        example = hax.vmap(LmExample.causal, batch)(hax.zeros((batch, model_config.max_Pos), dtype=jnp.int32))
        example = hax.shard(example, trainer.compute_axis_mapping)
        if probe.training:
            compiled = trainer._jit_train_step_fn_no_hook.lower(state, (example,), {}).compile()
        else:
            model = inference_mode(state.model, True)
            scored = hax.named_jit(_per_position_loss, axis_resources=trainer.compute_axis_mapping)
            compiled = scored.lower(model, example).compile()
    analysis = compiled.memory_analysis()
    parts = {
        "arguments": int(analysis.argument_size_in_bytes),
        "outputs": int(analysis.output_size_in_bytes),
        "temporaries": int(analysis.temp_size_in_bytes),
        "aliased": int(analysis.alias_size_in_bytes),
    }
    return {**parts, "total": parts["arguments"] + parts["outputs"] + parts["temporaries"] - parts["aliased"]}


def probe_trainer(probe: MemoryProbe):
    """The probe's Levanter `Trainer` (not entered), its model config and its model's init (the hero recipe's
    routing, on the probe's mesh, batch, microbatch and optimizer)."""
    import haliax as hax
    import jax
    from levanter.tracker import NoopConfig
    from levanter.trainer import Trainer, TrainerConfig

    from steps.model.levanter_config import qwen3_moe_config, trainer_mesh
    from steps.train.parallelism import precision_policy

    if jax.device_count() != probe.devices:
        raise ValueError(f"probe {probe.name} needs {probe.devices} devices, this process has {jax.device_count()}")
    model_config = qwen3_moe_config(
        probe.shape,
        tokenizer_path="unused",
        router_aux_loss_coef=None,
        router_bias_balancing=True,
        router_z_loss_weight=1e-4,
        capacity_factor=probe.capacity_factor,
        router_combine="sigmoid",
        router_combine_sum=2.5,
        remat=probe.remat,
        step=f"memory probe {probe.name}",
    )
    trainer_config = TrainerConfig(
        id=probe.name,
        mesh=trainer_mesh(probe.mesh, probe.shape, probe.devices),
        train_batch_size=probe.batch_size,
        per_device_parallelism=probe.per_device_microbatch,
        mp=precision_policy(probe.compute_dtype),
        require_accelerator=False,
        tracker=NoopConfig(),
    )

    def loss(model, example, *, key=None):  # train_lm's
        return model.compute_next_token_loss(example, key=key)

    def model_init():
        return model_config.build(hax.Axis("vocab", probe.shape.vocab_size), key=jax.random.PRNGKey(1))

    trainer = Trainer(trainer_config, probe_optimizer(probe.optimizer), loss, add_default_hooks=False)
    return trainer, model_config, model_init


def state_laid_out(trainer, model_init):
    """The trainer state `Trainer.initial_state` would build, as zeros on its layout: the compiled program depends on
    the state's shapes, dtypes and shardings only, and zeros need no compiled init (a third of a probe's CPU time).
    Each array is sharded as the initial state's compiled init lays it out (`parameter_axis_mapping`); an array no
    named axis places (step, key, optimizer counts) is replicated."""
    import equinox as eqx
    import haliax as hax
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    from levanter.trainer_state import TrainerState

    def init():
        return TrainerState.init(trainer.optimizer, model_init(), key=jax.random.PRNGKey(0), mp=trainer.mp,
                                 quantization=trainer.config.quantization,
                                 model_averaging=trainer.config.model_averaging)  # fmt: skip

    shapes = eqx.filter_eval_shape(init)
    shardings = hax.partitioning.infer_resource_partitions(shapes, trainer.parameter_axis_mapping,
                                                           mesh=trainer.device_mesh)  # fmt: skip

    def placed(shape, sharding: NamedSharding | None):
        if isinstance(shape, hax.NamedArray):
            return hax.NamedArray(placed(shape.array, sharding), shape.axes)
        if not isinstance(shape, jax.ShapeDtypeStruct):
            return shape
        if PartitionSpec.UNCONSTRAINED in sharding.spec:
            sharding = NamedSharding(trainer.device_mesh, PartitionSpec())
        return jax.device_put(np.zeros(shape.shape, shape.dtype), sharding)

    return hax.tree_util.tree_map(placed, shapes, shardings)


def probe_optimizer(name: str):
    """The probe's optimizer: AdamW, or the hero's at rates of the heuristic's order (rates move no memory)."""
    import optax

    from steps.train.optimizer import HeroHyperparameters, HeroOptimizerConfig

    if name == "adamw":
        return optax.adamw(1e-3)
    rates = HeroHyperparameters(adam_lr=0.01, muonh_lr=0.04, adamh_lr=0.04)
    return HeroOptimizerConfig(hyperparameters=rates, lr_schedule="linear", min_lr_ratio=0.05).build(100)


BAND = (0.8, 1.25)
"""Where every ratio must lie (tests/steps/train/test_memory_model.py)."""


def probe_shape(d_model: int = 96, layers: int = 8, seq: int = 128, latent: bool = True, vocab: int = 1024) -> MoeShape:
    """The hero's recipe (`ladder_shape`) in small: heads of 16, 2 KV heads local (window seq/4), 1 global (every
    4th and the last), 8 experts top-2 of width d/2 in a d/2 latent, two shared experts of width d/2."""
    half = d_model // 2
    return MoeShape(d_model=d_model, n_layers=layers, vocab_size=vocab, n_heads=d_model // 16, head_dim=16,
                    kv_heads_local=2, kv_heads_global=1, global_every=4, sliding_window=seq // 4, n_experts=8,
                    top_k=2, expert_width=half, latent_dim=half if latent else None, n_shared_experts=2,
                    shared_width=half, seq_len=seq)  # fmt: skip


PROBES = (
    MemoryProbe("1dev train capacity remat-layer", probe_shape()),
    MemoryProbe("1dev train dropless remat-none", probe_shape(64, 4, 64), batch_size=8, remat="none",
                capacity_factor=None),
    MemoryProbe("1dev train microbatches remat-period", probe_shape(), batch_size=16, microbatch=4, remat="period"),
    MemoryProbe("1dev train no-latent remat-layer", probe_shape(latent=False, layers=6)),
    MemoryProbe("2dev ep2 train capacity remat-layer", probe_shape(), mesh={"data": 1, "expert": 2}),
    MemoryProbe("4dev dp2xep2 train microbatches", probe_shape(), mesh={"data": 2, "expert": 2}, batch_size=16,
                microbatch=2),
    MemoryProbe("1dev train hero capacity remat-layer", probe_shape(), optimizer="hero"),
    MemoryProbe("2dev ep2 train hero microbatches", probe_shape(), mesh={"data": 1, "expert": 2}, batch_size=16,
                microbatch=4, optimizer="hero"),
    MemoryProbe("4dev ep4 eval capacity", probe_shape(), mesh={"data": 1, "expert": 4}, batch_size=16,
                training=False),
    MemoryProbe("2dev dp2 eval dropless", probe_shape(), mesh={"data": 2, "expert": 1}, batch_size=8,
                training=False, capacity_factor=None),
    # Shapes a reviewer chose: an eval on a data-only mesh with capacity (each device's slot grid is its own
    # sequences'), a train step on the same mesh, per-period and per-layer remat whose layers leave a tail (6
    # layers, a period of 4: one period, unrolled), and EP4 dropless with the hero optimizer and no remat.
    MemoryProbe("4dev dp4 eval capacity", probe_shape(), mesh={"data": 4, "expert": 1}, batch_size=64,
                training=False),
    MemoryProbe("4dev dp4 train capacity remat-layer", probe_shape(), mesh={"data": 4, "expert": 1},
                batch_size=16),
    MemoryProbe("1dev train remat-period tail", probe_shape(layers=6), batch_size=8, remat="period"),
    MemoryProbe("1dev train remat-layer tail", probe_shape(layers=6), batch_size=8, remat="layer"),
    MemoryProbe("4dev ep4 train hero dropless remat-none", probe_shape(64, 4, 64), mesh={"data": 1, "expert": 4},
                batch_size=16, remat="none", capacity_factor=None, optimizer="hero"),
)  # fmt: skip


def planned_bytes(probe: MemoryProbe) -> int:
    """The plan's figure for a probe: f32 compute, attention scores materialised (XLA's CPU attention)."""
    per_device = probe.batch_size // probe.devices
    return memory_per_device(
        probe.shape,
        probe.mesh,
        probe.per_device_microbatch,
        training=probe.training,
        remat=probe.remat if probe.training else "none",
        capacity_factor=probe.capacity_factor,
        microbatches=per_device // probe.per_device_microbatch,
        compute_bytes=4,
        attention_scores=True,
        optimizer=probe.optimizer,
    ).total


COMPILE_ONLY_FLAGS = UNOPTIMIZED_XLA_FLAG


def measure(probes: list[MemoryProbe]) -> dict[str, dict[str, int]]:
    """Compile each probe in a fresh process per device count; its compiled bytes by probe name."""
    measured: dict[str, dict[str, int]] = {}
    for devices in sorted({probe.devices for probe in probes}):
        names = [probe.name for probe in probes if probe.devices == devices]
        # The probes compile and never run: LLVM at -O0 (the stand-in hosts run at -O1, executor/run/cpu_devices.py)
        # compiles each in ~25% less CPU time; XLA assigns the buffers before LLVM runs, so the bytes are the same.
        flags = with_stand_in_flags(f"--xla_force_host_platform_device_count={devices} {COMPILE_ONLY_FLAGS}")
        # Nothing loads a probe's program again: writing it to a persistent compilation cache is work for nothing.
        environment = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
                       "JAX_ENABLE_COMPILATION_CACHE": "false"}  # fmt: skip
        done = subprocess.run([sys.executable, __file__, "--compile", json.dumps(names)], env=environment,
                              capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        results = [line for line in done.stdout.splitlines() if line.startswith("COMPILED ")]
        if done.returncode or len(results) != len(names):
            raise RuntimeError(f"compiling the probes on {devices} devices failed:\n{done.stderr[-4000:]}")
        for line in results:
            name, figures = json.loads(line.removeprefix("COMPILED "))
            measured[name] = figures
    return measured


def compile_named(names: list[str]) -> None:
    """In a process with the right device count: compile each named probe and print its figures."""
    for probe in PROBES:
        if probe.name in names:
            print("COMPILED " + json.dumps([probe.name, compiled_memory(probe)]), flush=True)


def compare(probes: list[MemoryProbe]) -> dict:
    measured = measure(probes)
    rows = []
    for probe in probes:
        compiled = measured[probe.name]["total"]
        planned = planned_bytes(probe)
        rows.append({"probe": probe.name, "devices": probe.devices, "mesh": probe.mesh,
                     "remat": probe.remat if probe.training else "none",
                     "capacity_factor": probe.capacity_factor, "training": probe.training,
                     "optimizer": probe.optimizer,
                     "compiled_bytes": compiled, "planned_bytes": planned,
                     "ratio": round(planned / compiled, 3)})  # fmt: skip
    ratios = [row["ratio"] for row in rows]
    return {"probes": rows, "worst_ratio": max(ratios, key=lambda ratio: abs(ratio - 1)), "min_ratio": min(ratios),
            "max_ratio": max(ratios), "band": list(BAND)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run the probes whose name holds this text")
    parser.add_argument("--compile", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile is not None:
        collect_rarely()
        compile_named(json.loads(args.compile))
        return
    result = compare([probe for probe in PROBES if args.only in probe.name])
    print(f"{'probe':40} {'compiled MB':>12} {'planned MB':>11} {'ratio':>6}")
    for row in result["probes"]:
        print(f"{row['probe']:40} {row['compiled_bytes'] / 1e6:12.2f} {row['planned_bytes'] / 1e6:11.2f} "
              f"{row['ratio']:6.3f}")  # fmt: skip
    record("bench_plan_memory", result, parser, args)


if __name__ == "__main__":
    main()
