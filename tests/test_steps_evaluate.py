"""The evaluate step on real Levanter: per-component loss and bits per byte on two validation caches, from a
checkpoint, and their macro average. The checkpoint here is an untrained model saved with Levanter's own
checkpointer, so the expected figures are known without training: the loss of a freshly initialised LM is
close to ln(vocabulary), and bits per byte is that loss in bits times the component's tokens per byte,
counted here independently from the cache rows and the tokenizer. (That a trained checkpoint scores lower and
matches the train step's own eval is asserted in test_steps_train.py, on its trained run.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from haliax import Axis
from levanter.checkpoint import save_checkpoint
from test_steps_train import SOURCES, build_data, tiny_shape

from steps.evaluate import EvaluateConfig, evaluate
from steps.levanter_cache import load_cache
from steps.levanter_config import qwen3_moe_config
from steps.train_tokenizer import load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_data(tmp_path_factory.mktemp("evaluate-data"))


def untrained_checkpoint(data: dict[str, str], root: Path) -> tuple[str, int]:
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    model_config = qwen3_moe_config(
        tiny_shape(vocab), tokenizer_path=data["tokenizer"], router_aux_loss_coef=None, step="test"
    )
    model = model_config.build(Axis("vocab", vocab), key=jax.random.PRNGKey(3))
    checkpoints = root / "checkpoints"
    save_checkpoint({"model": model}, step=0, checkpoint_path=str(checkpoints / "step-0"), is_temporary=False)
    return str(checkpoints), vocab


def tokens_per_byte(data: dict[str, str], source: str) -> float:
    """Predicted tokens (every token but each row's first) over the UTF-8 bytes they decode to."""
    tokenizer = load_tokenizer(data["tokenizer"])
    cache = load_cache(f"{data[source]}/validation")
    rows = [row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))]
    tokens = sum(len(row) - 1 for row in rows)
    text_bytes = sum(len(tokenizer.decode(row[1:].tolist(), skip_special_tokens=False).encode()) for row in rows)
    return tokens / text_bytes


def test_two_domains_loss_bpb_and_macro_average(data, tmp_path):
    checkpoints, vocab = untrained_checkpoint(data, tmp_path)
    config = EvaluateConfig(checkpoint_path=checkpoints, shape=tiny_shape(vocab), tokenizer_path=data["tokenizer"],
                            components={source: data[source] for source in SOURCES},
                            output_path=str(tmp_path / "eval-abc"), batch_size=4)  # fmt: skip
    results = evaluate(config)
    assert json.loads((tmp_path / "eval-abc" / "results.json").read_text()) == results
    assert results["step"] == 0 and results["checkpoint"].endswith("step-0")
    assert set(results["components"]) == set(SOURCES)
    for source in SOURCES:
        figures = results["components"][source]
        assert abs(figures["loss"] - math.log(vocab)) < 0.3, figures
        # Sequences are packed from the documents, so a few boundary tokens differ from per-row counting.
        expected_bpb = figures["loss"] / math.log(2) * tokens_per_byte(data, source)
        assert figures["bpb"] == pytest.approx(expected_bpb, rel=0.05), (figures, expected_bpb)
    losses = [results["components"][source]["loss"] for source in SOURCES]
    assert results["macro_loss"] == pytest.approx(float(np.mean(losses)))
    bpbs = [results["components"][source]["bpb"] for source in SOURCES]
    assert results["macro_bpb"] == pytest.approx(float(np.mean(bpbs)))
    assert bpbs[0] != pytest.approx(bpbs[1], rel=1e-3), "code and docstrings have different bytes per token"


def test_missing_checkpoint_is_refused(data, tmp_path):
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    config = EvaluateConfig(checkpoint_path=str(tmp_path / "none"), shape=tiny_shape(vocab),
                            tokenizer_path=data["tokenizer"], components={SOURCES[0]: data[SOURCES[0]]},
                            output_path=str(tmp_path / "eval-xyz"))  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"evaluate step eval-xyz .*no complete checkpoint"):
        evaluate(config)
    assert not (tmp_path / "eval-xyz").exists()
