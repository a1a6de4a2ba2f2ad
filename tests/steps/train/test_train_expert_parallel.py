"""The real train step (`steps.train.train.train`, Levanter's trainer) on a data=2 x expert=2 mesh of four fake
CPU devices, against the same step on one device: a tiny hero-shaped MoE (latent, shared and sigmoid-combined
experts, router-bias balancing) trains five f32 steps with the same losses, and its routed experts are split
over `expert` (each device holds half the experts, FSDP-split over `data` within its group: a quarter of their
bytes). The evaluate step then scores the one-device run's checkpoint on that mesh (the model loaded FSDP with
its experts split, each device scoring its share of every 8-sequence batch) with the one-device losses, with an
expert capacity and dropless, and the same dropped fraction. Each run is a subprocess: JAX fixes the device count
when it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest
from paths import REPO
from test_train import SOURCES, build_data, tiny_shape, train_config, train_losses

from steps.model.hf_export import HF_FOLDER, load_hf_export
from steps.tokenize.train_tokenizer import load_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.training, pytest.mark.timeout(3000)]

STEPS = 5

RUNNER = textwrap.dedent("""
    import json, os, sys
    from executor.run.collector import collect_rarely
    from executor.run.cpu_devices import with_stand_in_flags
    collect_rarely()
    os.environ["XLA_FLAGS"] = with_stand_in_flags(f"--xla_force_host_platform_device_count={sys.argv[1]}")
    import equinox as eqx, haliax as hax, jax, numpy as np
    from haliax import Axis
    from steps.model.checkpoints import latest_checkpoint, load_model
    from steps.model.model_size import MoeShape
    from steps.model.router_balance import settled
    from steps.train.train import TrainConfig, levanter_config, train
    from steps.train.train_metrics import read_metrics
    fields = json.loads(sys.argv[2])
    config = TrainConfig(**{**fields, "shape": MoeShape(**fields["shape"])})
    train(config)
    # The final checkpoint on the trainer's own mesh and parameter mapping: the layout its state had.
    run = levanter_config(config)
    checkpoint = latest_checkpoint(config.output_path + "/checkpoints", "test")
    with run.trainer.use_device_mesh(), hax.axis_mapping(run.trainer.parameter_axis_mapping):
        model = load_model(run.model, checkpoint, Axis("vocab", config.shape.vocab_size), run.trainer)
        experts = model.transformer.periods.stacked.global_layer.mlp.experts.gate_proj.weight
        shards = experts.array.addressable_shards
    # Every layer's trained weights, gathered, for the test to hold the step's HF export against (which holds
    # the router state settled: the bias the next step would route by, no histogram).
    layers = [leaf for layer in settled(model).transformer.layers_in_order()
              for leaf in jax.tree.leaves(eqx.filter(layer, eqx.is_inexact_array))]
    np.savez(config.output_path + "/trained_layers.npz", *(np.asarray(leaf) for leaf in layers))
    print("RESULT " + json.dumps({
        "devices": jax.device_count(),
        "records": read_metrics(config.output_path),
        "expert_axis": experts.axes.index(experts.resolve_axis("experts")),
        "shard_shapes": [list(shard.data.shape) for shard in shards],
        "shard_bytes": [shard.data.nbytes for shard in shards],
        "expert_bytes": experts.array.nbytes,
        "output_path": config.output_path,
        "shape": fields["shape"],
    }))
""")


def run_script(script: str, devices: int, fields: dict) -> dict:
    """Run `script` on `devices` fake CPU devices with the config `fields`; what it printed after RESULT."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-c", script, str(devices), json.dumps(fields)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=2400, cwd=REPO,
                          env=env)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def fields_of(data: dict[str, str], output_path: Path, mesh: dict[str, int] | None) -> dict:
    """The mesh run also exports the model to HF format after training (as every train step does by default)."""
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    shape = tiny_shape(vocab, latent_dim=16, n_shared_experts=1, shared_width=32)
    config = train_config(data, str(output_path), shape=shape, num_train_steps=STEPS, steps_per_eval=100,
                          max_eval_batches=1, checkpoint_every_steps=100, temporary_checkpoint_seconds=3600.0,
                          router_combine="sigmoid", router_combine_sum=2.5, hf_export=mesh is not None,
                          mesh=mesh)  # fmt: skip
    fields = {name: getattr(config, name) for name in config.__dataclass_fields__}
    return {**fields, "shape": shape.__dict__}


EVALUATOR = textwrap.dedent("""
    import json, os, sys
    from executor.run.collector import collect_rarely
    from executor.run.cpu_devices import with_stand_in_flags
    collect_rarely()
    os.environ["XLA_FLAGS"] = with_stand_in_flags(f"--xla_force_host_platform_device_count={sys.argv[1]}")
    from steps.evaluate.evaluate import EvaluateConfig, evaluate
    from steps.model.model_size import MoeShape
    fields = json.loads(sys.argv[2])
    print("RESULT " + json.dumps(evaluate(EvaluateConfig(**{**fields, "shape": MoeShape(**fields["shape"])}))))
""")


@pytest.fixture(scope="module")
def one_device_run(data: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The train step on one device (Levanter's default mesh)."""
    return run_script(RUNNER, 1, fields_of(data, tmp_path_factory.mktemp("train-one-device") / "one", None))


@pytest.fixture(scope="module")
def runs(data: dict[str, str], one_device_run: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The train step on one device, and on four with a data=2 x expert=2 mesh."""
    root = tmp_path_factory.mktemp("train-expert-parallel")
    return {
        "one": one_device_run,
        "four": run_script(RUNNER, 4, fields_of(data, root / "four", {"data": 2, "expert": 2})),
    }


def test_the_train_step_on_a_data2_x_expert2_mesh_trains_as_on_one_device_with_experts_split(runs):
    one, four = runs["one"], runs["four"]
    assert (one["devices"], four["devices"]) == (1, 4)
    one_losses, four_losses = dict(train_losses(one["records"])), dict(train_losses(four["records"]))
    assert sorted(one_losses) == sorted(four_losses) == list(range(STEPS))
    assert four_losses == pytest.approx(one_losses, abs=1e-4)
    # One device holds all 4 experts; on the mesh each shard holds 2 of them (split over `expert`) and half of
    # their hidden width (FSDP over `data`), so a quarter of the bytes.
    axis = four["expert_axis"]
    assert one["shard_bytes"] == [one["expert_bytes"]] and one["shard_shapes"][0][axis] == 4
    assert [shape[axis] for shape in four["shard_shapes"]] == [2, 2, 2, 2], four["shard_shapes"]
    assert four["shard_bytes"] == [four["expert_bytes"] // 4] * 4
    # The HF export the step wrote after training on the mesh, read back here (one device, a fresh process),
    # holds every layer's trained weights, experts included.
    assert not (Path(one["output_path"]) / HF_FOLDER).exists()
    exported = load_hf_export(str(Path(four["output_path"]) / HF_FOLDER))
    loaded = [leaf for layer in exported.transformer.layers_in_order()
              for leaf in jax.tree.leaves(eqx.filter(layer, eqx.is_inexact_array))]  # fmt: skip
    with np.load(Path(four["output_path"]) / "trained_layers.npz") as trained:
        assert len(trained.files) == len(loaded) > 0
        for index, leaf in enumerate(loaded):
            np.testing.assert_array_equal(np.asarray(leaf), trained[f"arr_{index}"], err_msg=str(index))


def test_evaluate_on_a_data2_x_expert2_mesh_scores_as_on_one_device(data, one_device_run, tmp_path):
    """With an expert capacity (a fair share per sequence) and dropless, drops included."""
    fields = {"checkpoint_path": one_device_run["output_path"] + "/checkpoints", "tokenizer_path": data["tokenizer"],
              "components": {source: data[source] for source in SOURCES}, "max_batches": 2,
              "router_combine": "sigmoid", "router_combine_sum": 2.5, "shape": one_device_run["shape"],
              "capacity_factor": 1.0}  # fmt: skip
    one = run_script(EVALUATOR, 1, {**fields, "output_path": str(tmp_path / "one")})
    # The same batch of 8 (2 sequences per device): Levanter's bits per byte move with the eval batch size
    # (0.1-0.7% here between 8 and 16, on one device as on four), the loss does not.
    four = run_script(EVALUATOR, 4, {**fields, "output_path": str(tmp_path / "four"), "batch_size": 8,
                                     "mesh": {"data": 2, "expert": 2}})  # fmt: skip
    assert four["dropped_fraction"] == one["dropped_fraction"] > 0
    for source in SOURCES:
        for panel in (four, four["dropless"]):
            reference = (one if panel is four else one["dropless"])["components"][source]
            assert panel["components"][source]["loss"] == pytest.approx(reference["loss"], abs=1e-4)
            assert panel["components"][source]["bpb"] == pytest.approx(reference["bpb"], abs=1e-4)
        assert four["components"][source]["dropped_fraction"] == one["components"][source]["dropped_fraction"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_data(tmp_path_factory.mktemp("train-data"))
