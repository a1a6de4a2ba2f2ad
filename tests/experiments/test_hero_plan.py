"""experiments/hero_535b.py: the full plan reproduces the published ladder table, and the tiny DAG (what
`make demo` runs) has the full DAG's steps and edges, so that what runs here is what would run on a cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO
from test_model_size import PUBLISHED

from executor import StepFunction
from executor.dag.identity import code_fingerprint, function_name
from executor.dag.plan import build_plan
from experiments import hero_535b
from steps.model.levanter_config import qwen3_moe_config
from steps.model.model_size import total_params
from steps.train.hardware import HARDWARE

RUNG_NAMES = ["d768", "d1024", "d1536", "d2048", "d6144"]
STANDS_FOR_THE_INTERNET = "raw/real_corpus"
SUITE_TEXT = {"full": "download/paloma", "tiny": "eval_suite/text"}
"""Where the eval suite's text comes from: Paloma from the Hub, or offline stand-ins."""


def structure(scale: hero_535b.Scale, prefix: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """Step names and (dependency, dependent) name pairs of the planned DAG."""
    plan = build_plan(hero_535b.build_dag(scale).steps, str(prefix))
    names = {planned.name for planned in plan.steps}
    edges = {(dependency.name, planned.name) for planned in plan.steps for dependency in planned.dependencies}
    return names, edges


def test_full_plan_reproduces_the_published_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plan_json = tmp_path / "plan.json"
    prefix = tmp_path / "prefix"
    hero_535b.main(["--scale", "full", "--dry_run", "true", "--plan_json", str(plan_json), "--prefix", str(prefix)])
    entries = json.loads(plan_json.read_text())
    assert not prefix.exists(), "a dry run wrote to the prefix"
    assert all({"name", "hash", "output_path", "action"} <= set(entry) for entry in entries)
    assert {entry["action"] for entry in entries} == {"run"}
    assert all(entry["output_path"] == f"{prefix}/{entry['name']}-{entry['hash'][:8]}" for entry in entries)
    trains = {entry["name"]: entry for entry in entries if entry["name"].startswith("train/")}
    assert sorted(trains) == sorted(f"train/{rung}" for rung in RUNG_NAMES)
    for rung, (_d, _layers, _batch, _steps, tokens, active, total, flops) in zip(RUNG_NAMES, PUBLISHED, strict=True):
        figures = trains[f"train/{rung}"]
        assert figures["total_params"] == pytest.approx(total, rel=0.03), rung
        assert figures["active_params"] == pytest.approx(active, rel=0.03), rung
        assert figures["tokens"] == pytest.approx(tokens, rel=0.02), rung
        assert figures["flops"] == pytest.approx(flops, rel=0.10), rung
    printed = capsys.readouterr().out
    assert "planned 41 steps in" in printed and "device-hours" in printed
    assert "d6144:  535.193B total,  22.650B active" in printed


def test_tiny_dag_has_the_full_dags_steps_and_edges(tmp_path: Path) -> None:
    full_names, full_edges = structure(hero_535b.full_scale(), tmp_path / "full")
    tiny_names, tiny_edges = structure(hero_535b.tiny_scale(), tmp_path / "tiny")
    assert tiny_names - full_names == {STANDS_FOR_THE_INTERNET, SUITE_TEXT["tiny"]}
    assert full_names - tiny_names == {SUITE_TEXT["full"]}
    as_tiny = {(SUITE_TEXT["tiny"] if a == SUITE_TEXT["full"] else a, b) for a, b in full_edges}
    assert {edge for edge in tiny_edges if edge[0] != STANDS_FOR_THE_INTERNET} == as_tiny
    # The prediction is registered before the hero starts; every rung is evaluated; the mixture has two phases.
    assert ("scaling/ladder", "train/d6144") in full_edges
    assert {(f"evaluate/{rung}", "scaling/ladder") for rung in RUNG_NAMES[:-1]} <= full_edges
    assert {("mix/weights", f"train/{rung}") for rung in RUNG_NAMES} <= full_edges
    assert len(hero_535b.PHASE_FRACTIONS) == 2


@pytest.mark.parametrize(("hardware", "per_host", "accelerator"), [("gb200", 4, "GB200"), ("h100", 8, "H100")])
def test_full_train_steps_ask_for_accelerators_and_tiny_ones_for_none(
    hardware: str, per_host: int, accelerator: str
) -> None:
    full = hero_535b.build_dag(hero_535b.full_scale(HARDWARE[hardware]))
    tiny = hero_535b.build_dag(hero_535b.tiny_scale())
    for rung, step in full.trains.values():
        assert step.resources.gpus == per_host and step.resources.accelerator_type == accelerator, rung.name
    assert all(step.resources.gpus == 0 for _rung, step in tiny.trains.values())


def test_tiny_models_have_the_heros_architecture() -> None:
    """`make demo` trains the hero's kind of model in small: a local layer and a global last one, local layers
    with more KV heads than global ones, routed experts of width d/2 inside a d/2 latent, two shared experts."""
    tiny, full = hero_535b.tiny_scale(), hero_535b.full_scale()
    for small, large in zip((*tiny.rungs, tiny.hero), (*full.rungs, full.hero), strict=True):
        shape, reference = small.shape, large.shape
        is_global = [shape.is_global(layer) for layer in range(shape.n_layers)]
        assert not all(is_global) and is_global[-1], small.name
        assert shape.sliding_window is not None and shape.sliding_window < shape.seq_len
        assert shape.kv_heads_local > shape.kv_heads_global  # d/512 vs d/1024 at full scale (equal below d1024)
        assert shape.latent_dim == shape.expert_width == shape.shared_width == shape.d_model // 2
        assert reference.latent_dim == reference.expert_width == reference.shared_width == reference.d_model // 2
        assert (shape.global_every, shape.n_shared_experts) == (reference.global_every, reference.n_shared_experts)
        config = qwen3_moe_config(shape, tokenizer_path="unused", router_aux_loss_coef=None, step=small.name)
        assert config.total_trainable_params(shape.vocab_size) == total_params(shape)


def test_a_rung_may_carry_its_own_learning_rate() -> None:
    """`Rung.learning_rate` overrides the recipe's peak learning rate for that rung's train step (hashed); a rung
    without one trains at the recipe's."""
    import dataclasses

    from executor import VersionedValue
    from experiments.train_defaults import default_train

    scale = hero_535b.tiny_scale()
    dag = hero_535b.build_dag(scale)
    _rung, trained = dag.trains[scale.rungs[0].name]
    tokenizer, tokenized, weights = (trained.config.tokenizer_path.step, trained.config.components_path.step,
                                     trained.config.mixture_weights_path.step)  # fmt: skip
    own = default_train(dataclasses.replace(scale.rungs[0], learning_rate=3e-2), scale.recipe, tokenizer, tokenized,
                        weights)  # fmt: skip
    assert trained.config.learning_rate == VersionedValue(scale.recipe.learning_rate)
    assert own.config.learning_rate == VersionedValue(3e-2)


TRAINING_LIBRARIES = ("jax", "jaxlib", "levanter", "haliax", "equinox", "optax", "transformers", "wandb", "torch")
DRY_RUN = """
import json, sys
from experiments import hero_535b
hero_535b.main(["--scale", "full", "--dry_run", "true", "--prefix", sys.argv[1]])
hero_535b.main(["--scale", "tiny", "--dry_run", "true", "--prefix", sys.argv[1]])
print("LOADED " + json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_the_dry_run_loads_no_training_library_and_each_step_names_its_function(tmp_path: Path) -> None:
    """The DAG names its heavy steps' functions by reference (`"steps.train.train:train"`) and builds their configs
    from modules of plain data (steps/train/train_config.py and the like), so a dry run of either scale, in a fresh
    process, imports none of JAX, Levanter and the rest (most of the time a dry run took, before). Each reference
    is planned with the name and the code fingerprint its function gets once imported."""
    done = subprocess.run([sys.executable, "-c", DRY_RUN, str(tmp_path / "prefix")], capture_output=True, text=True,
                          cwd=REPO, timeout=300)  # fmt: skip
    loaded = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    assert loaded, done.stdout[-2000:] + done.stderr[-4000:]
    assert not set(json.loads(loaded[0].removeprefix("LOADED "))) & set(TRAINING_LIBRARIES)
    assert not (tmp_path / "prefix").exists()

    plan = build_plan(hero_535b.build_dag(hero_535b.tiny_scale()).steps, str(tmp_path / "prefix"))
    by_reference = {planned.fn_name: planned for planned in plan.steps if isinstance(planned.step.fn, StepFunction)}
    assert {"steps.train.train:train", "steps.evaluate.evaluate:evaluate"} <= set(by_reference)
    for reference, planned in by_reference.items():
        function = planned.step.fn.load()
        assert (function_name(function), code_fingerprint(function)) == (reference, planned.fingerprint), reference
        assert planned.fingerprint is not None
