"""What XLA says a train or evaluate step needs per device: the yardstick the memory plan is held against.

`compiled_memory(probe)` builds the real model (steps/model/moe_model.py) from a `MemoryProbe` on this process's
devices, lays it out on the probe's mesh exactly as the train step does (steps/model/levanter_config.py
`trainer_mesh`), and compiles without running:

- **train**: Levanter's own train step (`Trainer._jit_train_step_fn_no_hook`: microbatched loss and gradient,
  AdamW's update, the state donated), on the probe's batch and microbatch;
- **eval**: the evaluate step's per-position loss (steps/evaluate/evaluate.py) on one eval batch, the model in
  inference mode.

Its figure is `compiled.memory_analysis()`'s arguments + outputs + temporaries - aliased bytes, per device.
benchmarks/bench_plan_memory.py and tests/test_plan_memory.py set a fake CPU device count before JAX loads and
compare it with steps/train/parallelism.py's `memory_per_device` for the same settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from steps.model.model_size import MoeShape


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

    @property
    def devices(self) -> int:
        size = 1
        for axis in self.mesh.values():
            size *= axis
        return size

    @property
    def per_device_microbatch(self) -> int:
        return self.batch_size // self.devices if self.microbatch is None else self.microbatch

    def as_json(self) -> dict:
        return {**dataclasses.asdict(self), "shape": dataclasses.asdict(self.shape)}


def compiled_memory(probe: MemoryProbe) -> dict[str, int]:
    """The compiled program's bytes per device (module docstring), by part and in `total`."""
    import haliax as hax
    import jax
    import jax.numpy as jnp
    import optax
    from levanter.models.lm_model import LmExample
    from levanter.tracker import NoopConfig
    from levanter.trainer import Trainer, TrainerConfig
    from levanter.utils.tree_utils import inference_mode

    from steps.evaluate.evaluate import _per_position_loss
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

    with Trainer(trainer_config, optax.adamw(1e-3), loss, add_default_hooks=False) as trainer:
        vocab = hax.Axis("vocab", probe.shape.vocab_size)
        state = trainer.initial_state(
            jax.random.PRNGKey(0), model_init=lambda: model_config.build(vocab, key=jax.random.PRNGKey(1))
        )
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
