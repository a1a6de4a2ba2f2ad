"""Mixtures through Levanter itself: the config `lm_mixture_data_config` builds is read by Levanter's own
`train_mixture` (its MixtureDataset), and the sequences drawn are traced back to the component whose cache
holds them, so the realized shares are measured from data, phase by phase. Plus the weights step's
exposure cap, and bad mixtures refused when the DAG is built."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import jax
import numpy as np
import pytest
from haliax import Axis
from levanter.schedule import BatchSchedule
from levanter.store.cache import TreeCache
from mixing_fixtures import write_hf_tokenizer, write_levanter_cache

from executor import THIS_OUTPUT_PATH, ExecutorStep
from executor.dag.plan import build_plan
from executor.errors import ConfigError
from experiments.defaults import TokenizedCache, lm_mixture_data_config
from steps.tokenize.mixture_weights import MixtureWeightsConfig, mixture_weights, phase_start
from steps.tokenize.tokenize import TokenizeConfig, tokenize

SEQ_LEN = 32
BATCH = 16
STEPS = 40
BLOCK = 128
ALPHABETS = {"alpha": "abcdef", "beta": "ghijkl", "gamma": "mnopqr", "held_out": "stuvwx"}
"""Each component's words use their own letters, so no sequence of one can be mistaken for another's."""


def component_texts(letters: str, seed: int, docs: int = 40) -> list[str]:
    rng = random.Random(seed)
    return [" ".join("".join(rng.choices(letters, k=rng.randint(2, 7))) for _ in range(rng.randint(30, 90)))
            for _ in range(docs)]  # fmt: skip


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> tuple[str, dict[str, TokenizedCache]]:
    root = tmp_path_factory.mktemp("mixture")
    texts = {name: component_texts(letters, seed) for seed, (name, letters) in enumerate(ALPHABETS.items())}
    tokenizer = write_hf_tokenizer(root / "tokenizer", [text for group in texts.values() for text in group])
    components = {}
    for name, group in texts.items():
        write_levanter_cache(str(root / name / "train"), tokenizer, group[:32])
        write_levanter_cache(str(root / name / "validation"), tokenizer, group[32:])
        components[name] = TokenizedCache(cache_dir=str(root / name), tokenizer=tokenizer)
    return tokenizer, components


def train_step(data_config) -> ExecutorStep:
    return ExecutorStep(name="train", fn=print, config=data_config)


def resolved(data_config):
    """The data config as a training step receives it, every marker resolved by the executor's planner."""
    step = train_step(data_config)
    return build_plan([step], "/tmp/prefix").lookup(step).config


def windows_of(cache_dir: str) -> list[tuple[int, ...]]:
    """The fixed-length sequences Levanter cuts from a cache's token stream (non-overlapping windows)."""
    cache = TreeCache.load(cache_dir, {"input_ids": np.zeros(0, dtype=np.int32)})
    tokens = [int(t) for row in cache.get_batch_sync(list(range(len(cache)))) for t in row["input_ids"]]
    return [tuple(tokens[i : i + SEQ_LEN]) for i in range(0, len(tokens) - SEQ_LEN + 1, SEQ_LEN)]


def realized_shares(config, components, first: int, last: int) -> dict[str, float]:
    owner = {window: name for name, c in components.items() for window in windows_of(f"{c.cache_dir}/train")}
    mixture = config.train_mixture(Axis("position", SEQ_LEN), BatchSchedule(BATCH), key=jax.random.PRNGKey(0))
    examples = mixture.as_sync_dataset().get_batch(list(range(first * BATCH, last * BATCH)))
    counts = Counter(owner[tuple(int(t) for t in example.tokens)] for example in examples)
    return {name: counts[name] / len(examples) for name in components}


@pytest.mark.timeout(900)
def test_realized_shares_match_the_weights_in_each_phase(caches):
    _, components = caches
    boundary = phase_start(STEPS, 0.8, BATCH, BLOCK)
    assert boundary == 32
    pretrain = {"alpha": 0.5, "beta": 0.3, "gamma": 0.2}
    cooldown = {"alpha": 0.1, "beta": 0.25, "gamma": 0.65}
    config = resolved(lm_mixture_data_config(components, [(0, pretrain), (boundary, cooldown)],
                                             mixture_block_size=BLOCK, batch_size=BATCH))  # fmt: skip
    for (first, last), weights in (((0, boundary), pretrain), ((boundary, STEPS), cooldown)):
        shares = realized_shares(config, components, first, last)
        assert shares["held_out"] == 0.0
        for name, weight in weights.items():
            assert shares[name] == pytest.approx(weight, abs=0.02), (first, name, shares)
    # The unweighted component is validation-only: absent from training, present in evaluation.
    assert config.train_weights[0][1]["held_out"] == 0.0
    assert set(config.validation_sets(Axis("position", SEQ_LEN))) == set(ALPHABETS)


@pytest.mark.timeout(900)
def test_tokenize_step_output_is_a_component(caches, tmp_path):
    tokenizer, components = caches
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n"
                            for i, t in enumerate(component_texts("yz", 9, docs=60))))  # fmt: skip
    output = str(tmp_path / "tokenized")
    tokenize(TokenizeConfig(input_paths=[str(docs)], tokenizer_path=tokenizer, output_path=output,
                            validation_fraction=0.2, parallelism="thread"))  # fmt: skip
    step = ExecutorStep(name="tokenized/yz", fn=tokenize, override_output_path=output, config=TokenizeConfig(
        input_paths=[str(docs)], tokenizer_path=tokenizer, output_path=THIS_OUTPUT_PATH))  # fmt: skip
    config = resolved(lm_mixture_data_config({"yz": step, "alpha": components["alpha"]}, {"yz": 1.0, "alpha": 1.0},
                                             mixture_block_size=BLOCK))  # fmt: skip
    assert config.components["yz"].cache_dir == output
    shares = realized_shares(config, {"yz": TokenizedCache(output, tokenizer), "alpha": components["alpha"]}, 0, 8)
    assert shares["yz"] == pytest.approx(0.5, abs=0.02)


def test_weights_are_versioned(caches):
    _, components = caches

    def step_hash(weights) -> str:
        step = train_step(lm_mixture_data_config(components, weights))
        return build_plan([step], "/tmp/prefix").lookup(step).hash

    base = step_hash({"alpha": 0.5, "beta": 0.5})
    assert step_hash({"alpha": 0.5, "beta": 0.5}) == base
    assert step_hash({"alpha": 0.6, "beta": 0.4}) != base
    assert step_hash([(0, {"alpha": 0.5, "beta": 0.5}), (32, {"alpha": 1.0})]) != base


@pytest.mark.parametrize(("weights", "message"), [
    ({"alpha": -0.1, "beta": 1.0}, r"phase 1: the weight of 'alpha' is negative"),
    ({"alpha": 0.0, "beta": 0.0}, r"phase 1: the weights sum to 0"),
    ([(8, {"alpha": 1.0})], r"first phase starts at step 8, not 0"),
    ([(0, {"alpha": 1.0}), (0, {"beta": 1.0})], r"phase 2 starts at step 0, not after phase 1"),
    ({"alpha": 1.0, "delta": 1.0}, r"phase 1 weights \['delta'\], which are not components"),
])  # fmt: skip
def test_bad_weights_are_refused_naming_the_function(caches, weights, message):
    _, components = caches
    with pytest.raises(ConfigError, match=rf"lm_mixture_data_config: .*{message}"):
        lm_mixture_data_config(components, weights)


def test_mixed_tokenizers_are_refused_naming_both_components(caches, tmp_path):
    _, components = caches
    other = TokenizeConfig(input_paths=["x"], tokenizer_path=str(tmp_path / "another"), output_path=THIS_OUTPUT_PATH)
    step = ExecutorStep(name="tokenized/other", fn=tokenize, config=other)
    with pytest.raises(ConfigError, match=r"one tokenizer, but 'other' \(step tokenized/other\) uses .*another'"):
        lm_mixture_data_config({"alpha": components["alpha"], "other": step}, {"alpha": 1.0})


def test_phase_off_a_mixture_block_is_refused(caches):
    _, components = caches
    with pytest.raises(ConfigError, match=r"step 31, where sequence 496 is not a multiple of mixture_block_size=128"):
        lm_mixture_data_config(components, [(0, {"alpha": 1.0}), (31, {"beta": 1.0})], mixture_block_size=BLOCK,
                               batch_size=BATCH)  # fmt: skip


def write_composition(folder: Path, cells: dict[str, tuple[int, int]]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    composition = {"cells": {name: {"tokens": tokens, "quality_bucket": bucket}
                             for name, (tokens, bucket) in cells.items()}}  # fmt: skip
    (folder / "composition.json").write_text(json.dumps(composition))
    return str(folder)


def test_weights_step_caps_exposure_and_reports_epochs(tmp_path):
    cells = {"big_q0": (9_000, 0), "big_q1": (6_000, 1), "small_q2": (500, 2), "empty_q0": (0, 0)}
    composition = write_composition(tmp_path / "cells", cells)
    output = tmp_path / "weights"
    mixture_weights(MixtureWeightsConfig(composition_path=composition, output_path=str(output), train_tokens=20_000,
                                         max_epochs=2.0, phase_fractions=[0.8, 0.2],
                                         quality_multipliers=[[1.0, 1.0, 1.0], [0.0, 1.0, 100.0]]))  # fmt: skip
    result = json.loads((output / "weights.json").read_text())
    for phase in result["phases"]:
        assert sum(phase["weights"].values()) == pytest.approx(1.0)
        assert min(phase["weights"].values()) >= 0.0
    epochs = result["expected_epochs"]
    assert max(epochs.values()) <= 2.0 + 1e-9
    assert epochs["small_q2"] == pytest.approx(2.0)  # the cooldown's 100x upweighting hit the cap
    assert result["capped"] == [[], ["small_q2"]]
    assert result["phases"][1]["weights"]["big_q0"] == 0.0
    assert result["empty"] == ["empty_q0"] and epochs["empty_q0"] == 0.0
    seen = sum(epochs[name] * tokens for name, (tokens, _) in cells.items())
    assert seen == pytest.approx(20_000)  # every training token is accounted for
    # Phase 1 has no multipliers: weights follow the token counts.
    assert result["phases"][0]["weights"]["big_q0"] == pytest.approx(9_000 / 15_500)


def test_weights_step_refuses_an_impossible_budget(tmp_path):
    composition = write_composition(tmp_path / "cells", {"a_q0": (100, 0)})
    with pytest.raises(ConfigError, match=r"mixture_weights step at .*weights: 1000 training tokens need more than"):
        mixture_weights(MixtureWeightsConfig(composition_path=composition, output_path=str(tmp_path / "weights"),
                                             train_tokens=1000, max_epochs=8.0))  # fmt: skip
