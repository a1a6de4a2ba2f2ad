"""Train a byte-level BPE tokenizer (HuggingFace `tokenizers`) on one or more text corpora.

Byte-level, as in GPT-2: text is first mapped to its UTF-8 bytes, so every string encodes and
decodes back exactly and there is no unknown token. After training, the step encodes every
document once more to measure what the tokenizer buys: tokens per byte of text, and how many
documents fail to round-trip (zero, unless something is broken).

Output: `tokenizer.json` (load with `tokenizers.Tokenizer.from_file`) and `stats.json`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from executor import storage
from steps.jsonl_shards import read_texts

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
_BYTE_ALPHABET = 256


@dataclass(frozen=True)
class TrainTokenizerConfig:
    input_paths: list[str]
    """Text corpus outputs (folders of shard-*.jsonl.gz) to train on, read in this order."""
    output_path: str
    """Where tokenizer.json and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    vocab_size: int = 4096
    """Target vocabulary size, special tokens included; at least 256 + the special tokens. Versioned."""
    min_frequency: int = 2
    """A pair must occur this often to be merged; small corpora may then stop short of vocab_size."""
    special_tokens: list[str] = field(default_factory=lambda: ["<|endoftext|>"])
    """Tokens added whole, never split or merged."""
    encode_batch_size: int = 64
    """Documents per `encode_batch` call while measuring; memory only, so unversioned."""


def train_tokenizer(config: TrainTokenizerConfig) -> None:
    if not config.input_paths:
        raise ValueError("input_paths is empty; give at least one text corpus output")
    smallest = _BYTE_ALPHABET + len(config.special_tokens)
    if config.vocab_size < smallest:
        raise ValueError(
            f"vocab_size {config.vocab_size} is too small: the byte alphabet and special tokens alone take {smallest}"
        )
    tokenizer = _new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(config.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(read_texts(config.input_paths), trainer=trainer)
    storage.write_atomic(storage.join(config.output_path, TOKENIZER_FILE), tokenizer.to_str())
    logger.info("trained a %d-token vocabulary", tokenizer.get_vocab_size())

    measured = measure(tokenizer, read_texts(config.input_paths), config.encode_batch_size, check_round_trip=True)
    stats = {
        "vocab_size": tokenizer.get_vocab_size(),
        "requested_vocab_size": config.vocab_size,
        "special_tokens": list(config.special_tokens),
        **measured,
    }
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), stats)
    logger.info("%.3f tokens per byte over %d docs", stats["tokens_per_byte"], stats["docs"])


def _new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    # No prefix space: it would add a byte to every document and break exact round trips.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def load_tokenizer(tokenizer_path: str) -> Tokenizer:
    """The tokenizer written by `train_tokenizer` under `tokenizer_path` (any fsspec location)."""
    path = storage.join(tokenizer_path, TOKENIZER_FILE)
    text = storage.read_text(path)
    if text is None:
        raise FileNotFoundError(f"no {TOKENIZER_FILE} at {path}; point tokenizer_path at a train_tokenizer output")
    return Tokenizer.from_str(text)


def measure(
    tokenizer: Tokenizer, texts: Iterable[str], batch_size: int, check_round_trip: bool = False
) -> dict[str, float | int]:
    """Docs, bytes, tokens and tokens per byte of `texts`; with `check_round_trip`, also how many
    documents do not decode back to themselves."""
    docs = total_bytes = tokens = round_trip_failures = 0
    for batch in itertools.batched(texts, batch_size):
        ids = [encoding.ids for encoding in tokenizer.encode_batch_fast(list(batch), add_special_tokens=False)]
        docs += len(batch)
        total_bytes += sum(len(text.encode("utf-8")) for text in batch)
        tokens += sum(len(doc_ids) for doc_ids in ids)
        if check_round_trip:
            decoded = tokenizer.decode_batch(ids, skip_special_tokens=False)
            round_trip_failures += sum(text != back for text, back in zip(batch, decoded, strict=True))
    figures: dict[str, float | int] = {
        "docs": docs,
        "bytes": total_bytes,
        "tokens": tokens,
        "tokens_per_byte": tokens / total_bytes if total_bytes else 0.0,
    }
    if check_round_trip:
        figures["round_trip_failures"] = round_trip_failures
    return figures
