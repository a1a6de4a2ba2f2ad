"""The data order (steps/train/data_order.py) on Levanter's own datasets: a mixture phase that starts at any
step leaves the batches before it as they were and reads nothing twice after it; a change on a block boundary
reads what Levanter's staged mixture reads; a capped component is never read past its cap while sampling;
skipped batches are never served; a fork that skips batches reads its parent's batches past them (token
arrays through the train step's own Levanter config, on real caches); per-component counts are what was served.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter

import jax
import numpy as np
import pytest
from haliax import Axis
from levanter.data.dataset import ListAsyncDataset
from levanter.data.mixture import MixtureDataset
from levanter.schedule import BatchSchedule
from levanter.store.cache import TreeCache
from levanter.utils.thread_utils import blocking_wait
from mixing_fixtures import write_hf_tokenizer, write_levanter_cache

from executor import THIS_OUTPUT_PATH, ExecutorStep, versioned
from executor.dag.plan import build_plan
from experiments.train_defaults import fork_of
from steps.model.model_size import MoeShape
from steps.train.data_order import DataOrder, DataOrderError, TokensSeen, caps_for, levanter_data_key
from steps.train.input_checks import TrainInputError
from steps.train.train import TrainConfig, check_inputs, data_mixture, levanter_config, train

BLOCK = 16
KEY = jax.random.PRNGKey(3)
EARLY = {"big": 0.5, "other": 0.25, "tiny": 0.25}
LATE = {"big": 0.125, "other": 0.5, "tiny": 0.375}  # whole sequences per block: exact shares over whole blocks


def listed(name: str, length: int) -> ListAsyncDataset[str]:
    return ListAsyncDataset([f"{name}:{index}" for index in range(length)])


DATASETS = {"big": listed("big", 1000), "other": listed("other", 1000), "tiny": listed("tiny", 6)}


def served(dataset, first: int, end: int) -> list[str]:
    return list(blocking_wait(dataset.get_batch(list(range(first, end)))))


def tally(sequences: list[str]) -> dict[str, int]:
    """Sequences per component, 0 for one not served."""
    return dict.fromkeys(DATASETS, 0) | Counter(item.split(":")[0] for item in sequences)


def test_a_phase_change_mid_block_keeps_the_batches_before_it_and_reads_nothing_twice() -> None:
    change = 40  # not a multiple of the 16-sequence block: Levanter's mixture refuses it
    with pytest.raises(AssertionError, match="multiple of block_size"):
        MixtureDataset(DATASETS, [(0, EARLY), (change, LATE)], block_size=BLOCK, key=KEY)
    order = DataOrder(DATASETS, [(0, EARLY), (change, LATE)], block_size=BLOCK, key=KEY, horizon=400)
    single = MixtureDataset(DATASETS, EARLY, block_size=BLOCK, key=KEY)
    sequences = served(order, 0, 400)
    assert sequences[:change] == served(single, 0, change)
    big_ones = Counter(item for item in sequences if not item.startswith("tiny"))
    assert max(big_ones.values()) == 1  # the large components never repeat a sequence across the change
    after = Counter(item.split(":")[0] for item in sequences[3 * BLOCK : 25 * BLOCK])  # whole blocks after it
    assert {name: count / (22 * BLOCK) for name, count in after.items()} == LATE


@pytest.mark.parametrize("late", [LATE, {"big": 0.3, "other": 0.7}])  # the second leaves tiny out
def test_a_change_on_a_block_boundary_reads_what_levanters_staged_mixture_reads(late) -> None:
    """So the hero DAG, whose phases start on blocks, reads what it read before the data order existed."""
    datasets = {**DATASETS, "held_out": listed("held_out", 50)}  # weighed by no phase: validation only
    phases = [(0, EARLY), (3 * BLOCK, late)]
    order = DataOrder(datasets, phases, block_size=BLOCK, key=KEY, horizon=300)
    staged = MixtureDataset(datasets, phases, block_size=BLOCK, key=KEY)
    assert served(order, 0, 300) == served(staged, 0, 300)


def test_a_capped_component_is_never_read_past_its_cap_while_sampling() -> None:
    phases = [(0, EARLY), (40, LATE)]
    uncapped = Counter(served(MixtureDataset(DATASETS, EARLY, block_size=BLOCK, key=KEY), 0, 400))
    assert max(count for item, count in uncapped.items() if item.startswith("tiny")) > 2  # Levanter restarts it
    order = DataOrder(DATASETS, phases, block_size=BLOCK, key=KEY, horizon=400, caps=caps_for(DATASETS, 2.0))
    sequences = served(order, 0, 400)
    tiny = Counter(item for item in sequences if item.startswith("tiny"))
    assert len(tiny) == 6 and max(tiny.values()) == 2  # the cap is reached within the run, and holds
    last_tiny = max(position for position, item in enumerate(sequences) if item.startswith("tiny"))
    assert last_tiny < 100  # then its share went to the others
    assert order.sequences_before(400) == tally(sequences)


def test_every_component_capped_is_refused_naming_the_step() -> None:
    with pytest.raises(DataOrderError, match=r"train step x: from sequence \d+ \(phase 1\).*raise max_epochs"):
        DataOrder({"tiny": DATASETS["tiny"]}, [(0, {"tiny": 1.0})], block_size=BLOCK, key=KEY, horizon=100,
                  caps=caps_for({"tiny": DATASETS["tiny"]}, 2.0), where="train step x")  # fmt: skip


def test_skipped_ranges_are_never_served_and_counts_are_what_was_served() -> None:
    phases = [(0, EARLY), (40, LATE)]
    order = DataOrder(DATASETS, phases, block_size=BLOCK, key=KEY, horizon=200)
    skipping = DataOrder(DATASETS, phases, block_size=BLOCK, key=KEY, horizon=200, skipped=[(24, 32), (64, 72)])
    everything, kept = served(order, 0, 216), served(skipping, 0, 200)
    assert kept == everything[:24] + everything[32:64] + everything[72:216]
    for end in (10, 24, 45, 130, 200):
        assert skipping.sequences_before(end) == tally(kept[:end])


# Through the train step's own Levanter config, on real caches: a fork that skips batches.
SEQ_LEN, BATCH, STEPS, FORK_AT = 32, 4, 30, 9


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> ExecutorStep:
    root = tmp_path_factory.mktemp("data-order")
    rng = random.Random(0)
    texts = {name: [" ".join("".join(rng.choices(letters, k=rng.randint(2, 6))) for _ in range(60))
                    for _ in range(24)] for name, letters in (("alpha", "abcdef"), ("beta", "ghijkl"))}  # fmt: skip
    tokenizer = write_hf_tokenizer(root / "tokenizer", [text for group in texts.values() for text in group])
    for name, group in texts.items():
        write_levanter_cache(str(root / name / "train"), tokenizer, group[:20])
        write_levanter_cache(str(root / name / "validation"), tokenizer, group[20:])
    shape = MoeShape(d_model=32, n_layers=2, vocab_size=400, n_heads=2, head_dim=16, kv_heads_local=1,
                     kv_heads_global=1, global_every=1, sliding_window=None, n_experts=4, top_k=2, expert_width=64,
                     latent_dim=None, n_shared_experts=0, shared_width=0, seq_len=SEQ_LEN)  # fmt: skip
    config = TrainConfig(shape=shape, tokenizer_path=tokenizer, output_path=THIS_OUTPUT_PATH,
                         components={name: str(root / name) for name in texts}, num_train_steps=versioned(STEPS),
                         train_batch_size=versioned(BATCH), weights=versioned({"alpha": 0.7, "beta": 0.3}),
                         mixture_block_size=versioned(BLOCK))  # fmt: skip
    return ExecutorStep(name="train/parent", fn=train, config=config)


def batches(step: ExecutorStep, steps: range) -> list[np.ndarray]:
    """The token arrays the step's Levanter config serves for `steps`, under the key Levanter gives its data."""
    config = build_plan([step], "/tmp/prefix").lookup(step).config
    data = levanter_config(config).data.train_set(Axis("position", SEQ_LEN), BatchSchedule(BATCH),
                                                  key=levanter_data_key(config.seed))  # fmt: skip
    examples = blocking_wait(data.get_batch(list(range(steps.start * BATCH, steps.stop * BATCH))))
    tokens = [np.asarray(example.tokens.array) for example in examples]
    return [np.stack(tokens[i : i + BATCH]) for i in range(0, len(tokens), BATCH)]


def test_a_fork_that_skips_batches_reads_its_parents_batches_past_them(parent: ExecutorStep) -> None:
    skipped = (FORK_AT + 1, FORK_AT + 4)  # the three batches after the checkpoint, say the ones behind a spike
    fork = fork_of(parent, step=FORK_AT, name="train/skip", skip_batches=versioned((skipped,)))
    assert "skip_batches" in fork.description
    parents, forks = batches(parent, range(STEPS)), batches(fork, range(STEPS - 3))
    for step, tokens in enumerate(forks):
        source = step if step < skipped[0] else step + 3
        np.testing.assert_array_equal(tokens, parents[source], err_msg=f"fork step {step}")
    assert not np.array_equal(forks[skipped[0]], parents[skipped[0]])


def cache_tokens(config: TrainConfig, name: str) -> set[int]:
    cache = TreeCache.load(f"{config.components[name]}/train", {"input_ids": np.zeros(0, dtype=np.int32)})
    return {int(token) for row in cache.get_batch_sync(list(range(len(cache)))) for token in row["input_ids"]}


def test_a_phase_list_may_start_a_phase_at_any_step(parent: ExecutorStep) -> None:
    phases = [(0, {"alpha": 0.7, "beta": 0.3}), (7, {"beta": 1.0})]  # step 7 x 4 sequences: mid-block
    changed = ExecutorStep(name="train/changed", fn=train,
                           config=dataclasses.replace(parent.config, weights=versioned(phases)))  # fmt: skip
    assert data_mixture(build_plan([changed], "/tmp/prefix").lookup(changed).config)[1] == phases
    before, after = batches(parent, range(STEPS)), batches(changed, range(STEPS))
    for step in range(7):
        np.testing.assert_array_equal(after[step], before[step])
    alpha_only = cache_tokens(parent.config, "alpha") - cache_tokens(parent.config, "beta")
    assert any(alpha_only & set(tokens.ravel().tolist()) for tokens in before[7:])  # alpha went on without the change
    assert not any(alpha_only & set(tokens.ravel().tolist()) for tokens in after[7:])  # from step 7, beta alone


@pytest.mark.parametrize(("skips", "message"), [
    (((5, 5),), r"skip_batches entry \(5, 5\) is no range of steps"),
    (((8, 12), (10, 14)), r"skip_batches .* overlap or are out of order"),
    ((("a", 3),), r"skip_batches entry \('a', 3\) is not a \(first step, end step\) pair"),
])  # fmt: skip
def test_bad_skip_batches_are_refused_before_any_compute(parent: ExecutorStep, skips, message) -> None:
    config = build_plan([parent], "/tmp/prefix").lookup(parent).config
    with pytest.raises(TrainInputError, match=rf"train step .*{message}"):
        check_inputs(dataclasses.replace(config, skip_batches=skips))


def test_max_epochs_holds_in_the_train_steps_own_data_order(parent: ExecutorStep) -> None:
    """Through TrainConfig.max_epochs on real caches: alpha (weight 0.7) is capped at one epoch and reaches it
    within the run; from then on beta alone is served, and the logged token counts say so."""
    config = dataclasses.replace(build_plan([parent], "/tmp/prefix").lookup(parent).config, max_epochs=1.0)
    data = levanter_config(config).data
    order = data.data_order(Axis("position", SEQ_LEN), BatchSchedule(BATCH), key=levanter_data_key(config.seed))
    alpha_length = len(windows(config, "alpha"))
    served = blocking_wait(order.get_batch(list(range(STEPS * BATCH))))
    alpha = [tuple(np.asarray(example.tokens).tolist()) for example in served
             if tuple(np.asarray(example.tokens).tolist()) in set(windows(config, "alpha"))]  # fmt: skip
    assert 0 < len(alpha) <= alpha_length and len(set(alpha)) == len(alpha)  # never past one epoch
    uncapped = levanter_config(dataclasses.replace(config, max_epochs=None)).data.data_order(
        Axis("position", SEQ_LEN), BatchSchedule(BATCH), key=levanter_data_key(config.seed))  # fmt: skip
    assert uncapped.sequences_before(STEPS * BATCH)["alpha"] > alpha_length // 2  # the cap is reached in the run
    tokens = TokensSeen(data, SEQ_LEN, BATCH, config.seed).after_step(STEPS - 1)
    assert tokens == {
        "data/tokens/alpha": len(alpha) * SEQ_LEN,
        "data/tokens/beta": (STEPS * BATCH - len(alpha)) * SEQ_LEN,
    }


def windows(config: TrainConfig, name: str) -> list[tuple[int, ...]]:
    """The fixed-length sequences Levanter cuts from a component's train cache."""
    cache = TreeCache.load(f"{config.components[name]}/train", {"input_ids": np.zeros(0, dtype=np.int32)})
    tokens = [int(token) for row in cache.get_batch_sync(list(range(len(cache)))) for token in row["input_ids"]]
    return [tuple(tokens[i : i + SEQ_LEN]) for i in range(0, len(tokens) - SEQ_LEN + 1, SEQ_LEN)]


def test_mixture_weights_phases_may_start_at_given_steps(parent: ExecutorStep, tmp_path) -> None:
    """The hero's switch at step 108,000 is no share of its 390,251 steps on a block: `phase_steps` places it."""
    weights = tmp_path / "weights"
    weights.mkdir()
    phases = [{"fraction": 0.8, "weights": {"alpha": 0.7, "beta": 0.3}}, {"fraction": 0.2, "weights": {"beta": 1.0}}]
    (weights / "weights.json").write_text(json.dumps({"phases": phases}))
    config = dataclasses.replace(build_plan([parent], "/tmp/prefix").lookup(parent).config, weights=None,
                                 mixture_weights_path=str(weights), phase_steps=[7])  # fmt: skip
    assert [start for start, _ in data_mixture(config)[1]] == [0, 7]
    with pytest.raises(TrainInputError, match=r"phase_steps \[7, 9\] give 2 starts for the 1 phases after the first"):
        data_mixture(dataclasses.replace(config, phase_steps=[7, 9]))
    with pytest.raises(TrainInputError, match=r"phase_steps: phase 2 starts at step 0, not after phase 1"):
        data_mixture(dataclasses.replace(config, phase_steps=[0]))
