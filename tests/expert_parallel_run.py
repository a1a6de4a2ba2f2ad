"""Run by tests/test_expert_parallel.py in a subprocess with four fake CPU devices: five AdamW steps of a tiny
hero-shaped MoE on one device and on a data=2 x expert=2 mesh; prints the losses, the bytes of routed expert
weights each device holds, and the compiled 4-device step's collectives, as JSON."""

from __future__ import annotations

import json
import os
import re
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import equinox as eqx
import haliax as hax
import jax
import numpy as np
from levanter.models.lm_model import LmExample
from levanter.optim.config import AdamConfig
from levanter.trainer_state import TrainerState

from steps.model.moe_model import MoeConfig

STEPS, BATCH, SEQ, VOCAB = 5, 8, 32, 128
Batch, Vocab = hax.Axis("batch", BATCH), hax.Axis("vocab", VOCAB)
MAPPING = {"batch": ("data", "expert"), "experts": "expert"}


def config() -> MoeConfig:
    return MoeConfig(max_seq_len=SEQ, hidden_dim=32, intermediate_dim=16, moe_intermediate_dim=16, num_layers=2,
                     num_heads=4, head_dim=8, num_kv_heads=1, num_kv_heads_local=2, sliding_window=8, global_every=2,
                     num_experts=8, num_experts_per_tok=2, expert_latent_dim=16, num_shared_experts=2,
                     shared_expert_intermediate_dim=16, router_aux_loss_coef=None, router_bias_balancing=True,
                     router_z_loss_weight=1e-3, router_combine="sigmoid", router_combine_sum=2.5,
                     gradient_checkpointing=False, tokenizer="unused", reference_checkpoint="unused")  # fmt: skip


def batches() -> list[LmExample]:
    keys = jax.random.split(jax.random.PRNGKey(7), STEPS)
    return [hax.vmap(LmExample.causal, Batch)(hax.random.randint(key, (Batch, hax.Axis("position", SEQ)), 0, VOCAB))
            for key in keys]  # fmt: skip


def run(devices: int) -> dict:
    shape = (1, 1) if devices == 1 else (2, 2)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]).reshape(shape), ("data", "expert"))
    optimizer = AdamConfig(learning_rate=1e-2, weight_decay=0.1, warmup=0.0, lr_schedule="constant").build(STEPS)
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping(MAPPING):
        model = hax.shard(config().build(Vocab, key=jax.random.PRNGKey(0)))
        state = TrainerState.init(optimizer, model, key=jax.random.PRNGKey(1), is_trainable=True)

        @eqx.filter_jit
        def step(state: TrainerState, example: LmExample):
            loss_fn = lambda m: m.compute_next_token_loss(example).scalar()  # noqa: E731
            loss, grads = eqx.filter_value_and_grad(loss_fn)(state.model)
            return state.take_step(grads, key=state.training_key)[0], loss

        examples = [hax.shard(example) for example in batches()]
        hlo = step.lower(state, examples[0]).compile().compiled.as_text()
        losses = []
        for example in examples:
            state, loss = step(state, example)
            losses.append(float(loss))
        experts = state.model.transformer.periods.stacked.global_layer.mlp.experts.gate_proj.weight.array
    # One entry per array a collective moves: XLA combines several into one op with a tuple result.
    collectives = [
        {"op": match.group(2), "shape": shape}
        for match in re.finditer(r"= (\([^()]*\)|[a-z0-9]+\[[0-9,]*\]\S*) (all-gather|all-to-all|all-reduce|"
                                 r"reduce-scatter)(?:-start)?\(", hlo)
        for shape in re.findall(r"[a-z0-9]+\[[0-9,]*\]", match.group(1))
    ]  # fmt: skip
    model_config = config()
    copies = BATCH * SEQ // devices * model_config.num_experts_per_tok
    router = model_config.num_experts * (model_config.hidden_dim + 1)
    # Per layer, f32: the routed copies to their experts and back, forward and backward, and the router gathered.
    minimum = 4 * model_config.num_layers * (4 * copies * model_config.expert_latent_dim + router)
    return {
        "minimum_collective_bytes": minimum if devices > 1 else 0,
        "losses": losses,
        "expert_bytes_per_device": experts.addressable_shards[0].data.nbytes,
        "expert_bytes": experts.nbytes,
        "collectives": collectives,
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(int(sys.argv[1]))))
