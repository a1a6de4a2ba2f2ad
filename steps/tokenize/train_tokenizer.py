"""Train a byte-level BPE tokenizer (HuggingFace `tokenizers`), or pin an existing one, as an HF tokenizer directory.

Byte-level, as in GPT-2: text is first mapped to its UTF-8 bytes, so every string encodes and
decodes back exactly and there is no unknown token. Training reads a sample of the documents:
the inputs taken round robin (so every source is in it) until `sample_bytes` of text.

The output is a directory that Levanter (`levanter.tokenizers.load_tokenizer`) and transformers
(`AutoTokenizer.from_pretrained`) load offline: `tokenizer.json`, `tokenizer_config.json` (which
special token is BOS / EOS) and `special_tokens_map.json`. The tokenize step appends the EOS id
to every document (and prepends BOS when there is one), as Levanter's cache builder does.

Instead of training, `existing=existing_tokenizer("/path/to/dir")` copies a local tokenizer
directory: the path is not versioned (moving the folder reruns nothing), the sha256 of each of
its files is, so editing a file gives the step a new hash, and a folder that changed after the
DAG was built is refused rather than silently copied.

After training (or copying), the step encodes the sample once more to measure what the tokenizer
buys: tokens per byte, and how many documents fail to round-trip (zero, unless something is broken).
Output: the tokenizer files above and `stats.json`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from executor import storage, versioned
from steps.data.jsonl_shards import read_records

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
_BYTE_ALPHABET = 256
_MODEL_MAX_LENGTH = 1 << 30
"""transformers wants a maximum length; sequence length is the trainer's business, so: effectively none."""


@dataclass(frozen=True)
class ExistingTokenizer:
    """A local HF tokenizer directory to use as is (build it with `existing_tokenizer(path)`)."""

    path: str
    """The directory. Not versioned: moving it reruns nothing."""
    sha256: dict[str, str]
    """File name -> sha256 of every file in it. Versioned: what identifies the tokenizer."""


def existing_tokenizer(path: str) -> ExistingTokenizer:
    """Pin the tokenizer directory at `path` by the hashes of its files, as they are now."""
    files = [name for name, _size in storage.walk_files(path) if "/" not in name]
    if TOKENIZER_FILE not in files:
        raise FileNotFoundError(f"{path} is not an HF tokenizer directory: it has no {TOKENIZER_FILE}")
    return ExistingTokenizer(path, versioned({name: storage.sha256_file(storage.join(path, name)) for name in files}))


@dataclass(frozen=True)
class TrainTokenizerConfig:
    input_paths: list[str]
    """Text corpus outputs (folders of shard-*.jsonl.gz) to train on, read round robin. Dependencies."""
    output_path: str
    """Where the tokenizer directory and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    vocab_size: int = 4096
    """Target vocabulary size, special tokens included; at least 256 + the special tokens. Versioned."""
    min_frequency: int = 2
    """A pair must occur this often to be merged; small corpora may then stop short of vocab_size. Versioned."""
    special_tokens: list[str] = field(default_factory=lambda: ["<|endoftext|>"])
    """Tokens added whole, never split or merged. Versioned."""
    eos_token: str = "<|endoftext|>"
    """Ends every document in the tokenize step's caches; one of `special_tokens`. Versioned."""
    bos_token: str | None = None
    """When set (one of `special_tokens`), starts every document. GPT-2 style has none. Versioned."""
    sample_bytes: int | None = None
    """Train on documents (round robin over the inputs) up to this much text; None: all. Versioned."""
    existing: ExistingTokenizer | None = None
    """Use this local tokenizer directory instead of training (its file hashes are versioned)."""
    encode_batch_size: int = 64
    """Documents per `encode_batch` call while measuring; memory only, so unversioned."""


def train_tokenizer(config: TrainTokenizerConfig) -> None:
    if config.existing is not None:
        tokenizer = _copy_existing(config.existing, config.output_path)
    else:
        _check(config)
        tokenizer = _train(config)
        _write_hf_directory(tokenizer, config)
    sample = list(_sample(config.input_paths, config.sample_bytes)) if config.input_paths else []
    measured = measure(tokenizer, sample, config.encode_batch_size, check_round_trip=True)
    stats = {
        "vocab_size": tokenizer.get_vocab_size(),
        "requested_vocab_size": None if config.existing else config.vocab_size,
        "special_tokens": list(config.special_tokens) if config.existing is None else None,
        "existing": config.existing.path if config.existing else None,
        **measured,
    }
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), stats)
    logger.info("%.3f tokens per byte over %d docs", stats["tokens_per_byte"], stats["docs"])


def _check(config: TrainTokenizerConfig) -> None:
    if not config.input_paths:
        raise ValueError("input_paths is empty; give at least one text corpus output (or an existing tokenizer)")
    smallest = _BYTE_ALPHABET + len(config.special_tokens)
    if config.vocab_size < smallest:
        raise ValueError(
            f"vocab_size {config.vocab_size} is too small: the byte alphabet and special tokens alone take {smallest}"
        )
    for role, token in (("eos_token", config.eos_token), ("bos_token", config.bos_token)):
        if token is not None and token not in config.special_tokens:
            raise ValueError(f"{role} {token!r} must be one of special_tokens {config.special_tokens}")


def _train(config: TrainTokenizerConfig) -> Tokenizer:
    tokenizer = _new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(config.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_sample(config.input_paths, config.sample_bytes), trainer=trainer)
    logger.info("trained a %d-token vocabulary", tokenizer.get_vocab_size())
    return tokenizer


def _sample(input_paths: list[str], sample_bytes: int | None) -> Iterator[str]:
    """Texts of the inputs taken round robin (one document of each in turn) until `sample_bytes` of text."""
    readers = [read_records(input_path) for input_path in input_paths]
    taken = 0
    for record in itertools.chain.from_iterable(itertools.zip_longest(*readers)):
        if record is None:
            continue
        if sample_bytes is not None and taken >= sample_bytes:
            return
        taken += len(record["text"].encode("utf-8"))
        yield record["text"]


def _new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    # No prefix space: it would add a byte to every document and break exact round trips.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _write_hf_directory(tokenizer: Tokenizer, config: TrainTokenizerConfig) -> None:
    special = {"eos_token": config.eos_token}
    if config.bos_token is not None:
        special["bos_token"] = config.bos_token
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": _MODEL_MAX_LENGTH,
        # Exact round trips: no space clean-up on decode, no specials added by `encode` (the tokenize step
        # adds them itself, once).
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        **special,
    }
    storage.write_atomic(storage.join(config.output_path, TOKENIZER_FILE), tokenizer.to_str())
    storage.write_json_atomic(storage.join(config.output_path, TOKENIZER_CONFIG_FILE), tokenizer_config)
    storage.write_json_atomic(storage.join(config.output_path, SPECIAL_TOKENS_FILE), special)


def _copy_existing(existing: ExistingTokenizer, output_path: str) -> Tokenizer:
    for name, expected in sorted(existing.sha256.items()):
        data = storage.read_bytes(storage.join(existing.path, name))
        if data is None:
            raise FileNotFoundError(f"{existing.path}/{name} is gone; the DAG pinned it (sha256 {expected[:12]})")
        found = hashlib.sha256(data).hexdigest()
        if found != expected:
            raise ValueError(
                f"{existing.path}/{name} changed since the DAG was built (sha256 {expected[:12]} pinned, "
                f"{found[:12]} now); rebuild the DAG so that existing_tokenizer() pins the new files"
            )
        storage.write_atomic(storage.join(output_path, name), data)
    return load_tokenizer(output_path)


@dataclass(frozen=True)
class SpecialTokenIds:
    """The ids the tokenize step frames every document with."""

    bos: int | None
    eos: int


def load_tokenizer(tokenizer_path: str) -> Tokenizer:
    """The tokenizer in the HF tokenizer directory `tokenizer_path` (any fsspec location)."""
    path = storage.join(tokenizer_path, TOKENIZER_FILE)
    text = storage.read_text(path)
    if text is None:
        raise FileNotFoundError(f"no {TOKENIZER_FILE} at {path}; point tokenizer_path at a train_tokenizer output")
    try:
        return Tokenizer.from_str(text)
    except Exception as error:  # the tokenizers library raises a bare Exception for a file it cannot parse
        reason = " ".join(str(error).split())
        raise ValueError(
            f"{path} is not a readable tokenizer ({reason}): the file is cut short or damaged; rerun the "
            "train_tokenizer step that wrote it (--force_run)"
        ) from error


def special_token_ids(tokenizer_path: str, tokenizer: Tokenizer) -> SpecialTokenIds:
    """BOS and EOS ids of `tokenizer` as the `tokenizer_config.json` beside it names them (as Levanter reads
    them); an EOS is required."""
    config = json.loads(storage.read_text(storage.join(tokenizer_path, TOKENIZER_CONFIG_FILE)) or "{}")
    ids = {}
    for role in ("bos_token", "eos_token"):
        token = config.get(role)
        token = token.get("content") if isinstance(token, dict) else token
        ids[role] = None if token is None else tokenizer.token_to_id(token)
        if token is not None and ids[role] is None:
            raise ValueError(f"{tokenizer_path}: {role} {token!r} of {TOKENIZER_CONFIG_FILE} is not in the vocabulary")
    eos = ids["eos_token"]
    if eos is None:
        raise ValueError(
            f"{tokenizer_path} names no eos_token in {TOKENIZER_CONFIG_FILE}: documents could not be separated; "
            "train the tokenizer with train_tokenizer (it writes one) or add eos_token to that file"
        )
    return SpecialTokenIds(bos=ids["bos_token"], eos=eos)


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
