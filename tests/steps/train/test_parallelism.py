"""steps/train/hardware.py and steps/train/parallelism.py: MFU over every device's peak, the hero's plan on
GB200 (fits) and on one H100 node (refused before any step runs, naming the step), and the memory estimate
the plan's choices (microbatch, remat, capacity, eval batch) handed to the steps that build them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jmp
import pytest
from levanter.utils.mesh import MeshConfig
from paths import REPO

from executor import storage
from experiments import hero_535b
from steps.model.levanter_config import trainer_mesh
from steps.model.model_size import flops_per_token, ladder_shape, uneven_splits
from steps.train.hardware import HARDWARE
from steps.train.parallelism import (
    PlanDoesNotFitError,
    expert_parallel_size,
    plan_parallelism,
    precision_policy,
    refuse_unless_fits,
)
from steps.train.train import TrainConfig, levanter_config
from steps.train.train_metrics import JsonlMetricsConfig, read_metrics

ROOT = REPO


def test_mfu_divides_by_every_devices_peak(tmp_path: Path) -> None:
    """A run on 8 H100s at a true 40% logs mfu 0.4 (today's tracker divided by one device's peak: 3.2)."""
    shape = ladder_shape(1024, 12)
    h100 = HARDWARE["h100"]
    config = JsonlMetricsConfig(output_path=str(tmp_path), flops_per_token=flops_per_token(shape),
                                peak_flops_per_device=h100.peak_flops_per_device, devices=8)  # fmt: skip
    tracker = config.init("run")
    tokens_per_second = 0.4 * 8 * h100.peak_flops_per_device / flops_per_token(shape)
    tracker.log({"throughput/tokens_per_second": tokens_per_second}, step=1)
    tracker.finish()
    assert read_metrics(str(tmp_path))[0]["mfu"] == pytest.approx(0.4)


def test_full_train_steps_log_mfu_against_their_hardwares_per_device_peak() -> None:
    for name, hardware in HARDWARE.items():
        dag = hero_535b.build_dag(hero_535b.full_scale(hardware))
        for _rung, step in dag.trains.values():
            assert step.config.peak_flops_per_device == hardware.peak_flops_per_device, (name, step.name)


def full_plan(tmp_path: Path, hardware: str) -> dict[str, dict]:
    plan_json = tmp_path / "plan.json"
    hero_535b.main(["--scale", "full", "--hardware", hardware, "--dry_run", "true", "--plan_json", str(plan_json),
                    "--prefix", str(tmp_path / "prefix")])  # fmt: skip
    return {entry["name"]: entry for entry in json.loads(plan_json.read_text())}


def test_the_heros_plan_on_gb200_fits_with_ep64(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    entries = full_plan(tmp_path, "gb200")
    hero = entries["train/d6144"]
    assert (hero["hardware"], hero["hosts"], hero["devices"]) == ("gb200", 256, 1024)
    # 16 racks of 64: data parallel across them, expert parallel inside each.
    assert hero["mesh"] == {"domain": 16, "data": 1, "expert": 64} and hero["fits"]
    memory = hero["memory_per_device_bytes"]
    parts = ("parameters", "gradients", "optimizer_state", "activations", "dispatch")
    assert memory["total"] == sum(memory[part] for part in parts)
    assert memory["total"] <= HARDWARE["gb200"].memory_bytes_per_device
    assert 11_264 % (hero["devices"] * hero["microbatch"]) == 0
    planned = [name for name in entries if name.startswith(("train/", "evaluate/"))]
    assert len(planned) == 10 and all(entries[name]["fits"] for name in planned)
    hero_step = hero_535b.build_dag(hero_535b.full_scale()).trains["d6144"][1]
    assert hero_step.config.per_device_parallelism == hero["microbatch"]  # microbatches, not the whole batch
    printed = capsys.readouterr().out
    assert "256 hosts x 4 gb200 = 1024 devices, mesh {'domain': 16, 'data': 1, 'expert': 64}, microbatch" in printed


def test_the_hero_on_one_h100_node_is_refused_naming_the_step(tmp_path: Path) -> None:
    # The dry run refuses the first step that does not fit: on one node already the d2048 rung, whose dense
    # weights are replicated over the 8 expert groups (FSDP over `data`, which is 1 here).
    with pytest.raises(PlanDoesNotFitError, match=r"train/d2048 .*8 h100 devices.*largest term is optimizer_state"):
        full_plan(tmp_path, "h100")
    assert not storage.exists(str(tmp_path / "prefix")), "a refused plan ran or recorded something"
    plans = hero_535b.step_plans(hero_535b.build_dag(hero_535b.full_scale(HARDWARE["h100"])))
    hero = next(plan for step, plan in plans.items() if step.name == "train/d6144")
    with pytest.raises(PlanDoesNotFitError, match=r"train/d6144: .*8 h100 devices.*largest term is optimizer_state"):
        refuse_unless_fits("train/d6144", hero)


@pytest.mark.slow
def test_the_refusal_reads_as_one_line_on_the_command_line(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "experiments" / "hero_535b.py"), "--scale", "full", "--hardware", "h100",
               "--check_sources", "false", "--dry_run", "true", "--prefix", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode != 0
    assert "Traceback (most recent call last)" not in done.stderr, done.stderr[-3000:]
    assert "PlanDoesNotFitError: train/d2048 (d2048: 22 layers" in done.stderr, done.stderr[-3000:]


def test_a_plan_whose_mesh_splits_a_dimension_unevenly_is_refused_naming_the_step() -> None:
    # The published 11 racks x EP64: a data axis of 11 divides neither d_model 6144 nor the experts' width.
    plan = plan_parallelism(ladder_shape(6144, 48), 11_264, HARDWARE["gb200"], 704, capacity_factor=1.15)
    assert plan.mesh == {"domain": 11, "data": 1, "expert": 64} and plan.fits and not plan.as_json()["buildable"]
    uneven = r"train/d6144: the mesh .*'domain': 11.*d_model over data x expert \(6144 by 704\)"
    with pytest.raises(PlanDoesNotFitError, match=uneven):
        refuse_unless_fits("train/d6144", plan)


def test_expert_parallelism_stays_inside_the_fast_domain() -> None:
    hero = ladder_shape(6144, 48)
    assert expert_parallel_size(hero, 1024, HARDWARE["gb200"]) == 64
    assert expert_parallel_size(hero, 8, HARDWARE["h100"]) == 8
    assert expert_parallel_size(hero, 1024, HARDWARE["tpu_v5p"]) == 64


def test_the_train_step_hands_levanter_its_precision_and_the_hero_computes_in_bf16(tmp_path: Path) -> None:
    shape = ladder_shape(768, 8)
    config = TrainConfig(shape=shape, tokenizer_path=str(tmp_path), components={"web": str(tmp_path)},
                         output_path=str(tmp_path / "run"), num_train_steps=10, train_batch_size=8,
                         compute_dtype="bfloat16")  # fmt: skip
    assert levanter_config(config).trainer.mp == precision_policy("bfloat16")
    assert levanter_config(dataclasses.replace(config, compute_dtype="float32")).trainer.mp == jmp.get_policy("f32")
    dag = hero_535b.build_dag(hero_535b.full_scale())
    assert {step.config.compute_dtype.value for _rung, step in dag.trains.values()} == {"bfloat16"}


def test_full_train_and_evaluate_steps_carry_their_plans_mesh_and_the_tiny_ones_levanters_default() -> None:
    dag = hero_535b.build_dag(hero_535b.full_scale())
    for rung, step in dag.trains.values():
        plan = rung.plan(dag.recipe)
        assert step.config.mesh == plan.mesh, step.name
        assert (step.config.remat, step.config.per_device_parallelism) == (plan.remat, plan.microbatch), step.name
    trains = {name: step for name, (_rung, step) in dag.trains.items()}
    for name, (rung, step) in dag.evaluates.items():
        plan = rung.plan(dag.recipe, training=False)
        assert plan.batch_size == step.config.batch_size, step.name  # sized on its own eval batch
        assert step.config.mesh == plan.mesh, step.name
        # The train step's eval batch (the same sequences), split evenly over the plan's devices.
        assert step.config.batch_size == trains[name].config.eval_batch_size, step.name
        assert step.config.batch_size % plan.devices == 0, step.name
    tiny = hero_535b.build_dag(hero_535b.tiny_scale())
    steps = [step for _rung, step in [*tiny.trains.values(), *tiny.evaluates.values()]]
    assert {step.config.mesh for step in steps} == {None}
    assert {step.config.batch_size for _rung, step in tiny.evaluates.values()} == {8}


def test_a_plans_mesh_becomes_levanters_batch_fsdp_and_expert_split() -> None:
    shape = ladder_shape(768, 8)
    mesh = trainer_mesh({"data": 2, "expert": 4}, shape, 8)
    assert mesh.axis_shapes(8, 1)[0] == {"data": 2, "replica": 1, "model": 1, "expert": 4}
    assert mesh.resolved_compute_mapping["batch"] == ("data", "expert")
    assert mesh.resolved_compute_mapping["experts"] == "expert"
    assert "embed" not in mesh.resolved_compute_mapping  # dense weights are gathered where they are used
    # Dense weights over every device; routed experts over `expert`, their hidden `mlp` axis FSDP over `data`.
    params = mesh.resolved_param_mapping
    assert (params["embed"], params["experts"], params["mlp"]) == (("data", "expert"), "expert", "data")
    assert trainer_mesh(None, shape, 8) == MeshConfig()
    with pytest.raises(ValueError, match=r"holds 4 devices but the run has 8"):
        trainer_mesh({"data": 2, "expert": 2}, shape, 8)
    with pytest.raises(ValueError, match=r"must map axes among \('domain', 'data', 'expert'\)"):
        trainer_mesh({"data": 2, "tensor": 4}, shape, 8)
    uneven = r"splits d_model over data x expert \(768 by 5\), expert_width over data \(384 by 5\) unevenly"
    with pytest.raises(ValueError, match=uneven):
        trainer_mesh({"data": 5}, shape, 5)
    # d_model splits over every device: 768 by data 2 x expert 256 is uneven, by each axis alone it is not.
    assert uneven_splits(dataclasses.replace(shape, n_experts=256), {"data": 2, "expert": 256}) == [
        "d_model over data x expert (768 by 512)"
    ]
