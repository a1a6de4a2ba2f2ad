"""The memory plan is the program: every planned figure within [0.8, 1.25] of XLA's compiled memory on the
hero's features scaled down (benchmarks/bench_plan_memory.py, each probe compiled on zeros laid out as the
trainer's initial state, which the probes' layout test holds it to), the remat policy the plan chose is the one the
model builds, a plan that does not fit is refused with its numbers and the smallest change that fits, and the
full plans for every hardware profile are the ones committed under tests/data/ (re-derive them with
`.venv/bin/python tests/steps/train/test_memory_model.py --write` after a deliberate change; say why
in the commit)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from paths import REPO

ROOT = REPO
sys.path.insert(0, str(ROOT))

from experiments import hero_535b  # noqa: E402
from steps.model.model_size import ladder_shape  # noqa: E402
from steps.train.hardware import HARDWARE  # noqa: E402
from steps.train.parallelism import PlanDoesNotFitError, plan_parallelism, refuse_unless_fits  # noqa: E402

PLANS = ROOT / "tests" / "data" / "plans"


def full_plans(hardware: str) -> dict[str, dict]:
    """Every train and evaluate step's plan of the full DAG on `hardware`, by step name."""
    dag = hero_535b.build_dag(hero_535b.full_scale(HARDWARE[hardware]))
    return {step.name: plan.as_json() for step, plan in hero_535b.step_plans(dag).items()}


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.timeout(900)
def test_every_planned_figure_lies_within_its_band_of_the_compiled_memory() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_plan_memory

    result = bench_plan_memory.compare(list(bench_plan_memory.PROBES))
    low, high = bench_plan_memory.BAND
    outside = [(row["probe"], row["ratio"]) for row in result["probes"] if not low <= row["ratio"] <= high]
    assert not outside, f"planned / compiled outside [{low}, {high}]: {outside}\n{json.dumps(result, indent=1)}"


LAYOUT_CHECK = textwrap.dedent("""
    import json, os, sys
    from executor.run.collector import collect_rarely
    from executor.run.cpu_devices import with_stand_in_flags
    collect_rarely()
    os.environ["XLA_FLAGS"] = with_stand_in_flags("--xla_force_host_platform_device_count=4")
    import jax
    sys.path.insert(0, "benchmarks")
    from bench_plan_memory import MemoryProbe, probe_shape, probe_trainer, state_laid_out
    probe = MemoryProbe("layout", probe_shape(32, 4, 32, vocab=128), mesh={"data": 2, "expert": 2}, batch_size=8,
                        optimizer="hero")
    trainer, _config, model_init = probe_trainer(probe)
    with trainer:
        initial = trainer.initial_state(jax.random.PRNGKey(0), model_init=model_init)
        laid_out = state_laid_out(trainer, model_init)
    (ours, our_tree), (theirs, their_tree) = jax.tree.flatten(laid_out), jax.tree.flatten(initial)
    def describe(leaf):
        return (leaf.shape, str(leaf.dtype), str(leaf.sharding.spec)) if isinstance(leaf, jax.Array) else leaf

    differ = [] if our_tree == their_tree else ["the tree"]
    for index, (our, their) in enumerate(zip(ours, theirs)):
        if not isinstance(their, jax.Array):
            same = our == their
        else:
            same = (our.shape, our.dtype) == (their.shape, their.dtype) and our.sharding.is_equivalent_to(
                their.sharding, their.ndim)
        if not same:
            differ.append(f"leaf {index}: {describe(our)} laid out, {describe(their)} initial")
    split = sum(1 for leaf in theirs if isinstance(leaf, jax.Array) and not leaf.sharding.is_fully_replicated)
    print("RESULT " + json.dumps({"leaves": len(theirs), "split": split, "differ": differ}))
""")


@pytest.mark.training
def test_the_probes_compile_on_the_layout_of_the_trainers_initial_state() -> None:
    """bench_plan_memory compiles each probe's train step on zeros laid out as `Trainer.initial_state` lays out its
    state, not on a compiled init's output (the program reads only shapes, dtypes and shardings): the same tree,
    shapes, dtypes and shardings, on a small probe with the hero optimizer over data=2 x expert=2 of four fake CPU
    devices (a subprocess: JAX fixes its device count when it starts)."""
    done = subprocess.run([sys.executable, "-c", LAYOUT_CHECK], capture_output=True, text=True, cwd=ROOT, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stderr[-4000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["differ"] == [] and result["leaves"] > 10 and result["split"] > 10, result


@pytest.mark.parametrize("hardware", sorted(HARDWARE))
def test_the_full_plans_are_the_committed_ones(hardware: str) -> None:
    committed = json.loads((PLANS / f"{hardware}.json").read_text())
    assert full_plans(hardware) == committed


def test_the_plan_recomputes_only_when_keeping_everything_does_not_fit() -> None:
    gb200 = HARDWARE["gb200"]
    small = plan_parallelism(ladder_shape(768, 8), 1024, gb200, 64, capacity_factor=1.15)
    assert (small.remat, small.microbatch, small.fits) == ("none", 16, True)
    big = plan_parallelism(ladder_shape(2048, 22), 11_264, gb200, 64, capacity_factor=1.15)
    assert big.remat in ("layer", "period") and big.fits
    kept = plan_parallelism(ladder_shape(2048, 22), 11_264, gb200, 64, capacity_factor=1.15, remat="none",
                            microbatch=big.microbatch)  # fmt: skip
    assert kept.memory.activations > big.memory.activations and not kept.fits
    evaluation = plan_parallelism(ladder_shape(2048, 22), 1024, gb200, 64, training=False, capacity_factor=1.15)
    assert (evaluation.remat, evaluation.batch_size, evaluation.memory.gradients) == ("none", 1024, 0)


def test_a_plan_that_does_not_fit_is_refused_with_its_numbers_and_the_smallest_change_that_fits() -> None:
    h100, hero = HARDWARE["h100"], ladder_shape(6144, 48)
    plan = plan_parallelism(hero, 11_264, h100, 8, capacity_factor=1.15)
    assert not plan.fits
    with pytest.raises(PlanDoesNotFitError) as refused:
        refuse_unless_fits("train/d6144", plan, hero)
    message = str(refused.value)
    over = (plan.memory.total - plan.memory_limit_bytes) / 1e9
    assert f"{over:,.1f} GB over" in message and "the largest term is optimizer_state" in message
    assert "the smallest change that fits is" in message
    devices = int(message.split("the smallest change that fits is ")[1].split(" devices")[0])
    assert plan_parallelism(hero, 11_264, h100, devices, capacity_factor=1.15).fits
    for fewer in range(plan.devices, devices, h100.devices_per_host):  # smallest: no fewer devices hold it
        if 11_264 % fewer == 0:
            smaller = plan_parallelism(hero, 11_264, h100, fewer, capacity_factor=1.15)
            assert not smaller.fits or smaller.uneven, fewer
    # A pinned microbatch that does not fit is told the one that does, on the same devices.
    d2048 = ladder_shape(2048, 22)
    pinned = plan_parallelism(d2048, 11_264, HARDWARE["gb200"], 64, capacity_factor=1.15, microbatch=176)
    with pytest.raises(PlanDoesNotFitError, match=r"The smallest change that fits: microbatch \d+ with remat"):
        refuse_unless_fits("train/d2048", pinned, d2048)


def test_the_model_builds_the_remat_policy_it_is_given() -> None:
    """Per layer: the local stack keeps each layer's input (and each global layer runs under jax.checkpoint); per
    period: the stack of periods does; none: neither recomputes."""
    import haliax as hax
    import jax

    from steps.model.levanter_config import qwen3_moe_config
    from steps.model.moe_model import MoeLMHeadModel

    shape = hero_535b.tiny_shape(32, 6, 128)  # one full period of 4 and a tail of 2
    recomputed = {}
    vocab = hax.Axis("vocab", 128)
    for policy in ("none", "layer", "period"):
        config = qwen3_moe_config(shape, tokenizer_path="unused", router_aux_loss_coef=None, step="t", remat=policy)
        model = jax.eval_shape(lambda c=config: MoeLMHeadModel.init(vocab, c, key=jax.random.PRNGKey(0)))
        periods = model.transformer.periods
        recomputed[policy] = (not periods.gradient_checkpointing.disable,
                              not periods.stacked.local.gradient_checkpointing.disable,
                              not model.transformer.tail.local.gradient_checkpointing.disable)  # fmt: skip
    assert recomputed == {"none": (False, False, False), "layer": (False, True, True), "period": (True, False, False)}


def write_plans() -> None:
    PLANS.mkdir(parents=True, exist_ok=True)
    for hardware in sorted(HARDWARE):
        (PLANS / f"{hardware}.json").write_text(json.dumps(full_plans(hardware), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write_plans()
