"""Run by tests/test_router_microbatch.py in a subprocess with N fake CPU devices: five f32 AdamW steps of a tiny
hero-shaped MoE with router-bias balancing through Levanter's own `Trainer` (its jitted train step, gradient
accumulation included), once per microbatch count; prints each run's losses as JSON.

    python tests/support/router_microbatch_run.py 4 1 2 4     # 4 devices (data=2 x expert=2); 1, 2 and 4 microbatches

The microbatch count is Levanter's `per_device_parallelism`: the batch split into that many sequential passes
whose gradients `levanter.grad_accum.microbatched` adds up (and whose router state it folds)."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from executor.run.collector import collect_rarely
from executor.run.cpu_devices import UNOPTIMIZED_XLA_FLAG, with_stand_in_flags

DEVICES = int(sys.argv[1])
# Each count's step against the whole batch's, both compiled alike: LLVM at -O0 (less CPU, same arithmetic).
os.environ["XLA_FLAGS"] = with_stand_in_flags(
    f"--xla_force_host_platform_device_count={DEVICES} {UNOPTIMIZED_XLA_FLAG}"
)

import haliax as hax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from levanter.models.lm_model import LmExample  # noqa: E402
from levanter.optim.config import AdamConfig  # noqa: E402
from levanter.trainer import Trainer  # noqa: E402
from scratch_trainer import scratch_trainer_config  # noqa: E402

from steps.model.levanter_config import qwen3_moe_config, trainer_mesh  # noqa: E402
from steps.model.model_size import MoeShape  # noqa: E402
from steps.model.router_balance import RouterBalance  # noqa: E402

STEPS, BATCH, VOCAB = 5, 16, 128
SHAPE = MoeShape(d_model=32, n_layers=2, vocab_size=VOCAB, n_heads=4, head_dim=8, kv_heads_local=1,
                 kv_heads_global=1, global_every=1, sliding_window=None, n_experts=8, top_k=2, expert_width=16,
                 latent_dim=None, n_shared_experts=1, shared_width=16, seq_len=32)  # fmt: skip
Batch, Vocab = hax.Axis("batch", BATCH), hax.Axis("vocab", VOCAB)


def batches() -> list[LmExample]:
    keys = jax.random.split(jax.random.PRNGKey(7), STEPS)
    position = hax.Axis("position", SHAPE.seq_len)
    return [hax.vmap(LmExample.causal, Batch)(hax.random.randint(key, (Batch, position), 0, VOCAB)) for key in keys]


def routing_biases(model) -> np.ndarray:
    """Every MoE layer's next routing bias (`RouterBalance.routing_bias`: the carried bias moved by the histogram the
    last step counted), concatenated."""
    balances = [leaf for leaf in jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, RouterBalance))
                if isinstance(leaf, RouterBalance)]  # fmt: skip
    return np.concatenate([np.asarray(balance.routing_bias().array).ravel() for balance in balances])


def kept(state):
    """A copy of a train state: `Trainer.train_step` donates the state it is given."""
    return jax.tree.map(lambda leaf: jnp.copy(leaf) if isinstance(leaf, jax.Array) else leaf, state)


def run(counts: list[int]) -> dict:
    """The whole-batch run's five steps (the first count's), then each other count's step from the same states.

    Trajectories are compared step by step from one state, not run apart: a top-k choice near a tie flips on the
    float noise of summing in another order (Adam amplifies it where a gradient is near zero), and from a flip on
    two runs of the same rule drift apart, a CPU's rounding deciding where.
    From the whole-batch run's state before each step, each count's step gives the next step's loss (the next
    batch's, from the state it reached) and the routing bias it moves to, to be compared with the whole batch's."""
    model_config = qwen3_moe_config(SHAPE, tokenizer_path="unused", router_aux_loss_coef=None, step="microbatches",
                                    router_bias_balancing=True, router_z_loss_weight=1e-3, router_combine="sigmoid",
                                    router_combine_sum=2.5)  # fmt: skip
    # The random router is unbalanced, so the bias moves from the first step whatever the learning rate.
    optimizer = AdamConfig(learning_rate=3e-3, weight_decay=0.1, warmup=0.0, lr_schedule="constant").build(STEPS)

    def loss_function(model, example: LmExample, *, key=None):
        return model.compute_next_token_loss(example, key=key)

    examples = batches()
    reference: dict = {}
    found: dict = {}
    with tempfile.TemporaryDirectory(prefix="router-microbatch-run-") as scratch:
        mesh = trainer_mesh({"data": 2, "expert": 2} if DEVICES == 4 else None, SHAPE, DEVICES)
        for microbatches in counts:
            parallelism = BATCH // DEVICES // microbatches if microbatches > 1 else -1
            config = scratch_trainer_config(scratch, f"router-microbatch-{microbatches}", mesh, BATCH, STEPS,
                                            parallelism)  # fmt: skip
            trainer = Trainer(config, optimizer, loss_function, add_default_hooks=False)
            with trainer:
                sharded = [hax.shard(example, trainer.compute_axis_mapping) for example in examples]
                if not reference:  # the whole batch: the trajectory every other count steps from
                    state = trainer.initial_state(
                        jax.random.PRNGKey(1), model_init=lambda: model_config.build(Vocab, key=jax.random.PRNGKey(0))
                    )
                    reference = {"states": [], "losses": [], "biases": []}
                    for example in sharded:
                        reference["states"].append(kept(state))
                        info = trainer.train_step(state, example)
                        state = info.state
                        reference["losses"].append(float(info.loss))
                        reference["biases"].append(routing_biases(state.model))
                    continue
                steps = []
                for step in range(STEPS - 1):
                    after = trainer.train_step(kept(reference["states"][step]), sharded[step])
                    bias = float(np.abs(routing_biases(after.state.model) - reference["biases"][step]).max())
                    following = trainer.train_step(after.state, sharded[step + 1])  # its loss: the state it reached
                    steps.append({"loss": float(after.loss), "next_loss": float(following.loss), "bias": bias})
                found[str(microbatches)] = steps
    bias_scale = float(max(np.abs(bias).max() for bias in reference["biases"]))
    return {"losses": reference["losses"], "bias_scale": bias_scale, "forced": found}


if __name__ == "__main__":
    collect_rarely()
    print("RESULT " + json.dumps(run([int(count) for count in sys.argv[2:]])))
