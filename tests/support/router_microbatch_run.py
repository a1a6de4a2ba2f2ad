"""Run by tests/steps/model/test_router_balance.py in a subprocess: steps of a tiny hero-shaped MoE with router-bias
balancing through Levanter's own `Trainer` (its jitted train step, gradient accumulation included), once per
microbatch count; prints the comparison as JSON on a `RESULT ` line. Two modes:

    python tests/support/router_microbatch_run.py 4 1 2 4     # 4 devices (data=2 x expert=2); 1, 2 and 4 microbatches
    python tests/support/router_microbatch_run.py apart adamw  # 1 device, f64: 20 steps run apart in 1, 2, 4, 8
    python tests/support/router_microbatch_run.py apart hero float32   # the same in f32, to see rounding drift

The first compares five f32 AdamW steps from one state (`run`); the second runs each microbatch count's 20 steps
apart from one initial state, dropless and with a capacity, in float64 unless told float32 (`run_apart`): the
optimizer `adamw` or `hero`. The microbatch count is Levanter's `per_device_parallelism`: the batch split into
that many sequential passes whose gradients `levanter.grad_accum.microbatched` adds up (and whose router state it
folds)."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile

from executor.run.collector import collect_rarely
from executor.run.cpu_devices import UNOPTIMIZED_XLA_FLAG, with_stand_in_flags

APART = sys.argv[1] == "apart"
DEVICES = 1 if APART else int(sys.argv[1])
APART_DTYPE = sys.argv[3] if APART and len(sys.argv) > 3 else "float64"
if APART_DTYPE not in ("float64", "float32"):
    sys.exit(f"router_microbatch_run.py: apart runs in float64 or float32, not {APART_DTYPE!r}")
if APART and APART_DTYPE == "float64":  # before JAX loads: float64 arrays (jax.config's `jax_enable_x64`)
    os.environ["JAX_ENABLE_X64"] = "1"
# Each count's step against the whole batch's, both compiled alike: LLVM at -O0 (less CPU, same arithmetic).
os.environ["XLA_FLAGS"] = with_stand_in_flags(
    f"--xla_force_host_platform_device_count={DEVICES} {UNOPTIMIZED_XLA_FLAG}"
)

import haliax as hax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from levanter.models.lm_model import LmExample  # noqa: E402
from levanter.optim.config import AdamConfig, OptimizerConfig  # noqa: E402
from levanter.trainer import Trainer  # noqa: E402
from scratch_trainer import scratch_trainer_config  # noqa: E402

from steps.model.levanter_config import qwen3_moe_config, trainer_mesh  # noqa: E402
from steps.model.model_size import MoeShape  # noqa: E402
from steps.model.router_balance import RouterBalance, RouterStatePolicy  # noqa: E402
from steps.train.optimizer import levanter_optimizer  # noqa: E402
from steps.train.train_config import MoeHeuristic  # noqa: E402

STEPS, BATCH, VOCAB = 5, 16, 128
APART_STEPS, APART_COUNTS, APART_CAPACITIES = 20, (1, 2, 4, 8), (None, 1.15)
SHAPE = MoeShape(d_model=32, n_layers=2, vocab_size=VOCAB, n_heads=4, head_dim=8, kv_heads_local=1,
                 kv_heads_global=1, global_every=1, sliding_window=None, n_experts=8, top_k=2, expert_width=16,
                 latent_dim=None, n_shared_experts=1, shared_width=16, seq_len=32)  # fmt: skip
Batch, Vocab = hax.Axis("batch", BATCH), hax.Axis("vocab", VOCAB)


def moe_config(capacity_factor: float | None):
    return qwen3_moe_config(SHAPE, tokenizer_path="unused", router_aux_loss_coef=None, step="microbatches",
                            router_bias_balancing=True, router_z_loss_weight=1e-3, router_combine="sigmoid",
                            router_combine_sum=2.5, capacity_factor=capacity_factor)  # fmt: skip


def loss_function(model, example: LmExample, *, key=None):
    return model.compute_next_token_loss(example, key=key)


def batches(steps: int = STEPS) -> list[LmExample]:
    keys = jax.random.split(jax.random.PRNGKey(7), steps)
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
    model_config = moe_config(capacity_factor=None)
    # The random router is unbalanced, so the bias moves from the first step whatever the learning rate.
    optimizer = AdamConfig(learning_rate=3e-3, weight_decay=0.1, warmup=0.0, lr_schedule="constant").build(STEPS)
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


def apart_optimizer(name: str) -> OptimizerConfig:
    """`adamw` at 3e-3, or the hero recipe (`hero`) with the rates `MoeHeuristic` gives this run; a constant rate."""
    tokens_per_batch = BATCH * SHAPE.seq_len
    hero = MoeHeuristic().hyperparameters(APART_STEPS * tokens_per_batch, tokens_per_batch, SHAPE.d_model)
    return levanter_optimizer(name, learning_rate=3e-3, weight_decay=0.1, warmup=0.0, min_lr_ratio=1.0,
                              lr_schedule="constant", hero=hero)  # fmt: skip


def run_apart(optimizer_name: str, dtype: str) -> dict:
    """Each microbatch count's 20 steps run apart from one initial state, dropless and with capacity 1.15, in
    `dtype`: "float64" (master weights and compute, the router included: it computes in at least f32,
    `router_dtype`; Levanter reports the loss in f32) or "float32" (the train step's own policy): per capacity and
    count other than 1, each step's loss and routing bias against the whole batch's (absolute differences).

    Float64 because the comparison is of the update rule, not of f32 rounding: in f32 the gradient's sum over
    tokens is grouped per pass, and over 20 steps that noise compounds (Adam's normalised update amplifies it
    where a gradient is near zero) until a near-tied top-k choice flips (docs/training.md, "Microbatches and the
    whole batch"). A rule that made a step depend on its passes moves a float64 run apart all the same (the last
    microbatch's histogram kept in place of the sum: the bias 0.27 apart at the first step)."""
    optimizer = apart_optimizer(optimizer_name).build(APART_STEPS)
    policy = RouterStatePolicy(jnp.float64, jnp.float64, jnp.float64) if dtype == "float64" else None
    examples = batches(APART_STEPS)
    result: dict = {"optimizer": optimizer_name, "routings": {}}
    weight_dtypes: set[str] = set()  # of every run's weights
    with tempfile.TemporaryDirectory(prefix="router-microbatch-apart-") as scratch:
        mesh = trainer_mesh(None, SHAPE, DEVICES)
        for capacity in APART_CAPACITIES:
            model_config = moe_config(capacity)
            runs: dict[int, tuple[list[float], list[np.ndarray]]] = {}
            for microbatches in APART_COUNTS:
                parallelism = BATCH // DEVICES // microbatches if microbatches > 1 else -1
                config = scratch_trainer_config(scratch, f"apart-{capacity}-{microbatches}", mesh, BATCH, APART_STEPS,
                                                parallelism, mp=policy)  # fmt: skip
                trainer = Trainer(config, optimizer, loss_function, add_default_hooks=False)
                with trainer:
                    state = trainer.initial_state(jax.random.PRNGKey(1), model_init=functools.partial(
                        model_config.build, Vocab, key=jax.random.PRNGKey(0)))  # fmt: skip
                    weight_dtypes.update(str(leaf.dtype) for leaf in jax.tree.leaves(state.model)
                                         if isinstance(leaf, jax.Array))  # fmt: skip
                    losses, biases = [], []
                    for example in examples:
                        info = trainer.train_step(state, hax.shard(example, trainer.compute_axis_mapping))
                        state = info.state
                        losses.append(float(info.loss))
                        biases.append(routing_biases(state.model))
                runs[microbatches] = (losses, biases)
            whole_losses, whole_biases = runs[1]
            result["routings"][str(capacity)] = {
                "losses": whole_losses,
                "bias_scale": float(max(np.abs(bias).max() for bias in whole_biases)),
                "apart": {str(count): [{"loss": abs(loss - whole), "bias": float(np.abs(bias - whole_bias).max())}
                                       for loss, whole, bias, whole_bias
                                       in zip(losses, whole_losses, biases, whole_biases, strict=True)]
                          for count, (losses, biases) in runs.items() if count != 1},
            }  # fmt: skip
    result["weight_dtypes"] = sorted(weight_dtypes)
    return result


if __name__ == "__main__":
    collect_rarely()
    if APART:
        print("RESULT " + json.dumps(run_apart(sys.argv[2], APART_DTYPE)))
    else:
        print("RESULT " + json.dumps(run([int(count) for count in sys.argv[2:]])))
