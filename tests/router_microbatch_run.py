"""Run by tests/test_router_microbatch.py in a subprocess with N fake CPU devices: five f32 AdamW steps of a tiny
hero-shaped MoE with router-bias balancing through Levanter's own `Trainer` (its jitted train step, gradient
accumulation included), once per microbatch count; prints each run's losses as JSON.

    python tests/router_microbatch_run.py 4 1 2 4     # 4 devices (data=2 x expert=2); 1, 2 and 4 microbatches

The microbatch count is Levanter's `per_device_parallelism`: the batch split into that many sequential passes
whose gradients `levanter.grad_accum.microbatched` adds up (and whose router state it folds)."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from executor.cpu_devices import with_stand_in_flags

DEVICES = int(sys.argv[1])
os.environ["XLA_FLAGS"] = with_stand_in_flags(f"--xla_force_host_platform_device_count={DEVICES}")

import haliax as hax  # noqa: E402
import jax  # noqa: E402
from levanter.models.lm_model import LmExample  # noqa: E402
from levanter.optim.config import AdamConfig  # noqa: E402
from levanter.trainer import Trainer  # noqa: E402
from scratch_trainer import scratch_trainer_config  # noqa: E402

from steps.model.levanter_config import qwen3_moe_config, trainer_mesh  # noqa: E402
from steps.model.model_size import MoeShape  # noqa: E402

STEPS, BATCH, VOCAB = 5, 16, 128
SHAPE = MoeShape(d_model=32, n_layers=2, vocab_size=VOCAB, n_heads=4, head_dim=8, kv_heads_local=1,
                 kv_heads_global=1, global_every=1, sliding_window=None, n_experts=8, top_k=2, expert_width=16,
                 latent_dim=None, n_shared_experts=1, shared_width=16, seq_len=32)  # fmt: skip
Batch, Vocab = hax.Axis("batch", BATCH), hax.Axis("vocab", VOCAB)


def batches() -> list[LmExample]:
    keys = jax.random.split(jax.random.PRNGKey(7), STEPS)
    position = hax.Axis("position", SHAPE.seq_len)
    return [hax.vmap(LmExample.causal, Batch)(hax.random.randint(key, (Batch, position), 0, VOCAB)) for key in keys]


def losses(microbatches: int) -> list[float]:
    """The five steps' losses with the batch in `microbatches` sequential passes."""
    model_config = qwen3_moe_config(SHAPE, tokenizer_path="unused", router_aux_loss_coef=None, step="microbatches",
                                    router_bias_balancing=True, router_z_loss_weight=1e-3, router_combine="sigmoid",
                                    router_combine_sum=2.5)  # fmt: skip
    # The random router is unbalanced, so the bias moves from the first step whatever the learning rate. A small
    # one keeps the float noise of summing the batch's gradients in another order (which Adam amplifies where a
    # gradient is near zero) near 1e-6 of loss: with balancing off, microbatches differ by 1e-6 over 5 steps.
    optimizer = AdamConfig(learning_rate=3e-3, weight_decay=0.1, warmup=0.0, lr_schedule="constant").build(STEPS)

    def loss_function(model, example: LmExample, *, key=None):
        return model.compute_next_token_loss(example, key=key)

    with tempfile.TemporaryDirectory(prefix="router-microbatch-run-") as scratch:
        mesh = trainer_mesh({"data": 2, "expert": 2} if DEVICES == 4 else None, SHAPE, DEVICES)
        parallelism = BATCH // DEVICES // microbatches if microbatches > 1 else -1
        config = scratch_trainer_config(scratch, "router-microbatch-run", mesh, BATCH, STEPS, parallelism)
        trainer = Trainer(config, optimizer, loss_function, add_default_hooks=False)
        with trainer:
            state = trainer.initial_state(
                jax.random.PRNGKey(1), model_init=lambda: model_config.build(Vocab, key=jax.random.PRNGKey(0))
            )
            found = []
            for example in batches():
                info = trainer.train_step(state, hax.shard(example, trainer.compute_axis_mapping))
                state = info.state
                found.append(float(info.loss))
    return found


if __name__ == "__main__":
    print("RESULT " + json.dumps({count: losses(int(count)) for count in sys.argv[2:]}))
