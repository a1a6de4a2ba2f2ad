"""fastText quality classification: train a classifier, then score and filter documents with it.

`train_quality_classifier` learns `__label__positive` vs `__label__negative` from two document
sets (say, reference text against random web text), holding out `heldout_fraction` of each class
to report held-out accuracy. The split hashes the normalised text (`steps/dedup/minhash.normalize`,
whitespace collapsed), not the id: copies of a text under different ids all land on one side, so
held-out accuracy is never inflated by documents the model trained on.
Training uses one thread: fastText's parallel SGD is not deterministic, and a step's output should
be a function of its config.

Training runs in a fresh (spawned) process, because of a fastText bug: `DenseMatrix::uniform`
cuts the input embedding matrix into 10 blocks and fills one block per training thread, so with
`thread=1` only the first tenth is initialized and the rest is whatever memory the allocator hands
back. In a process that has already freed large buffers (a second training, a test session, a
long-lived worker) that is stale data: values like 4.7e34 that make training stop with
"Encountered NaN." or leave n-gram buckets unseen in training with random weights, so held-out
accuracy wanders from run to run with the same seed. The child process asks glibc to serve every
large allocation from fresh, zero-filled pages (`M_MMAP_THRESHOLD`), so the rest of the matrix
starts at exactly zero and training is reproducible. The weights are checked after training; a
run that still diverges is retried once at a quarter of the learning rate (logged), and a second
failure is an error naming the step's output and its data size, never a silently bad model.

`fasttext_filter` scores every document with P(label) and keeps it if the score is at least
`threshold`, or, with `keep_fraction`, if it is in the top fraction of all scores. A label the
model does not know is refused up front, naming the model's labels (it used to score 1 - p).
The quantile needs every shard's scores, so filtering then runs in two passes: each shard scores
its documents and commits one 64-bit rank key per document, the score's float32 bits above 32 bits
of a hash of the text, so equal scores are ordered by text hash, deterministically and whatever the
sharding. The driver then selects the exact key of rank `keep_fraction * N` with a radix select,
four passes of a 65,536-bin histogram over the shards' key files (8 bytes per document per pass,
one shard in memory at a time), and a second shard pass keeps the keys at or above it. A histogram
of scores alone cannot do this: with 85% of scores at 0.9995, every bin edge keeps 0% or 85%.
Scoring calls fastText's batched `predict` on a whole shard at once.

Outputs: `model.bin` + `stats.json` (train); `docs/`, `scores/shard-*.parquet` (id, score) and
`stats.json` (filter).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from executor import Shard, ShardWriter, run_sharded, storage
from steps.data.arrays import load_arrays, save_arrays
from steps.data.documents import (
    ReadReport,
    flow_stats,
    list_input_files,
    merge_stats,
    read_documents,
    shard_file,
    text_bytes,
    to_table,
    write_stats,
    write_table,
)
from steps.dedup.minhash import normalize

logger = logging.getLogger(__name__)

MODEL_FILE = "model.bin"
POSITIVE = "__label__positive"
NEGATIVE = "__label__negative"
_DIGIT_BITS = 16
RETRY_LR_FACTOR = 0.25
"""On divergence, training is retried once at this fraction of the learning rate."""
MAX_ABS_WEIGHT = 1e4
"""Trained weights start within 1/dim of zero and move by bounded SGD steps; far larger ones mean
divergence or uninitialized memory, and the model is rejected."""
_GLIBC_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 128 * 1024


class ClassifierTrainingError(RuntimeError):
    """fastText training diverged (NaN or runaway weights) even at the lowered learning rate."""


def fasttext_line(text: str) -> str:
    """One line of input for fastText: it reads up to a newline, so newlines become spaces (it splits
    words on any whitespace itself, so nothing else needs normalizing)."""
    return text.replace("\n", " ")


@dataclass(frozen=True)
class TrainClassifierConfig:
    positive_paths: list[str]
    """Documents of the class to keep (files, folders or globs). Versioned via the DAG."""
    negative_paths: list[str]
    """Documents of the class to drop."""
    output_path: str
    """Where model.bin and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    max_docs_per_class: int = 20000
    """At most this many documents of each class (the first ones). Versioned."""
    heldout_fraction: float = 0.1
    """Share of each class kept out of training to measure accuracy. Versioned."""
    epochs: int = 5
    """fastText `epoch`. Versioned."""
    learning_rate: float = 0.5
    """fastText `lr`. Versioned."""
    word_ngrams: int = 2
    """fastText `wordNgrams`. Versioned."""
    dim: int = 64
    """fastText `dim`. Versioned."""
    bucket: int = 200_000
    """fastText hash buckets for n-grams; the model file is about bucket * dim * 4 bytes. Versioned."""
    seed: int = 0
    """fastText `seed`. Versioned."""


def _split(paths: list[str], limit: int, heldout_fraction: float, label: str) -> tuple[list[str], list[str]]:
    train: list[str] = []
    heldout: list[str] = []
    report = ReadReport()
    for path in list_input_files(paths):
        for document in read_documents(path, report, raw=False):
            if len(train) + len(heldout) >= limit:
                return train, heldout
            line = f"{label} {fasttext_line(document['text'])}"
            normalised = " ".join(normalize(document["text"]).split())
            in_heldout = xxhash.xxh64_intdigest(normalised) % 10_000 < heldout_fraction * 10_000
            (heldout if in_heldout else train).append(line)
    return train, heldout


def _zero_filled_large_allocations() -> None:
    """Serve allocations of 128 KiB and more from mmap, whose pages the kernel zero-fills (glibc only;
    elsewhere a fresh process is all there is, and the weight check below still guards)."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name) if libc_name else None
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_GLIBC_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


def _train_in_this_process(train_file: str, model_file: str, params: dict[str, Any]) -> str | None:
    """Train and save the model; returns why the model is unusable, or None. Runs in a fresh process."""
    _zero_filled_large_allocations()
    import fasttext

    try:
        model = fasttext.train_supervised(input=train_file, thread=1, verbose=0, **params)
    except RuntimeError as error:
        if "NaN" not in str(error):
            raise
        return str(error)
    for name, weights in (("input", model.get_input_matrix()), ("output", model.get_output_matrix())):
        largest = float(np.max(np.abs(weights))) if weights.size else 0.0
        if not np.isfinite(largest) or largest > MAX_ABS_WEIGHT:
            return f"{name} weights reach {largest:.3g}"
    model.save_model(model_file)
    return None


def _train_model(config: TrainClassifierConfig, train_file: str, model_file: str, tokens: int) -> float:
    """Train into `model_file`, retrying once at a lower learning rate; returns the rate that worked."""
    learning_rate = config.learning_rate
    failure: str | None = None
    params = {"epoch": config.epochs, "wordNgrams": config.word_ngrams, "dim": config.dim,
              "bucket": config.bucket, "seed": config.seed}  # fmt: skip
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        for attempt in (1, 2):
            settings = {**params, "lr": learning_rate}
            failure = pool.submit(_train_in_this_process, train_file, model_file, settings).result()
            if failure is None:
                return learning_rate
            if attempt == 1:
                logger.warning("%s: fastText training diverged at lr=%g (%s); retrying once at lr=%g",
                               config.output_path, learning_rate, failure, learning_rate * RETRY_LR_FACTOR)  # fmt: skip
                learning_rate *= RETRY_LR_FACTOR
    raise ClassifierTrainingError(
        f"train_quality_classifier at {config.output_path}: fastText diverged ({failure}) at lr="
        f"{config.learning_rate:g} and again at lr={learning_rate:g}, on {tokens} training tokens; "
        "lower learning_rate or epochs, or give it more documents"
    )


def train_quality_classifier(config: TrainClassifierConfig) -> None:
    if not 0 < config.heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {config.heldout_fraction}")
    positive_train, positive_heldout = _split(config.positive_paths, config.max_docs_per_class,
                                              config.heldout_fraction, POSITIVE)  # fmt: skip
    negative_train, negative_heldout = _split(config.negative_paths, config.max_docs_per_class,
                                              config.heldout_fraction, NEGATIVE)  # fmt: skip
    if not positive_train or not negative_train:
        raise ValueError(f"{config.output_path}: both classes need training documents "
                         f"(positive {len(positive_train)}, negative {len(negative_train)})")  # fmt: skip
    train_lines = sorted(positive_train + negative_train, key=lambda line: xxhash.xxh64_intdigest(line))
    heldout_lines = positive_heldout + negative_heldout
    tokens = sum(len(line.split()) - 1 for line in train_lines)
    with tempfile.TemporaryDirectory() as folder:
        train_file = os.path.join(folder, "train.txt")
        with open(train_file, "w", encoding="utf-8") as handle:
            handle.writelines(line + "\n" for line in train_lines)
        model_file = os.path.join(folder, MODEL_FILE)
        learning_rate = _train_model(config, train_file, model_file, tokens)
        storage.upload_file(model_file, storage.join(config.output_path, MODEL_FILE))
        import fasttext

        model = fasttext.load_model(model_file)
    correct = 0
    if heldout_lines:
        labels, _ = model.predict([line.split(" ", 1)[1] for line in heldout_lines])
        pairs = zip(labels, heldout_lines, strict=True)
        correct = sum(predicted[0] == line.split(" ", 1)[0] for predicted, line in pairs)
    stats = {"train_docs": len(train_lines), "train_tokens": tokens, "heldout_docs": len(heldout_lines),
             "heldout_accuracy": correct / len(heldout_lines) if heldout_lines else None,
             "positive_docs": len(positive_train) + len(positive_heldout),
             "negative_docs": len(negative_train) + len(negative_heldout),
             "learning_rate": learning_rate}  # fmt: skip
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), stats)
    logger.info("trained on %d docs; held-out accuracy %s", stats["train_docs"], stats["heldout_accuracy"])


@dataclass(frozen=True)
class FasttextFilterConfig:
    input_paths: list[str]
    """Document files, folders or globs to score."""
    model_path: str
    """A train_quality_classifier output (holding model.bin)."""
    output_path: str
    """Where docs/, scores/ and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    threshold: float | None = None
    """Keep documents with P(positive) >= threshold. Exactly one of this and keep_fraction. Versioned."""
    keep_fraction: float | None = None
    """Keep this top fraction of documents by score (a global quantile). Versioned."""
    label: str = POSITIVE
    """The label whose probability is the score."""
    raw_input: bool = False
    """Whether an input file with no usable document is an error (True for raw downloads)."""


_MODELS: dict[str, Any] = {}


def load_model(model_path: str) -> Any:
    """The model under `model_path`, loaded once per process (fastText reads only local files)."""
    import fasttext

    if model_path not in _MODELS:
        path = storage.join(model_path, MODEL_FILE)
        data = storage.read_bytes(path)
        if data is None:
            raise FileNotFoundError(f"no {MODEL_FILE} at {path}; point model_path at a train_quality_classifier output")
        with tempfile.NamedTemporaryFile(suffix=".bin") as handle:
            handle.write(data)
            handle.flush()
            _MODELS[model_path] = fasttext.load_model(handle.name)
    return _MODELS[model_path]


def score_texts(model: Any, texts: list[str], label: str = POSITIVE) -> np.ndarray:
    """P(label) for every text, with one batched fastText call.

    Only the top label is asked for (k=1, the cheapest call); with two classes the other's
    probability is its complement, and with more, a text whose top label is another scores 0.
    fastText reports probabilities plus 1e-5 (up to 1.00001): scores are clipped to [0, 1] so that
    none falls outside the quantile histogram's range.
    """
    if not texts:
        return np.zeros(0, dtype=np.float32)
    labels, probabilities = model.predict([fasttext_line(text) for text in texts], k=1)
    top = np.array([names[0] == label for names in labels])
    best = np.array([probs[0] for probs in probabilities], dtype=np.float32)
    other = 1.0 - best if len(model.get_labels()) == 2 else 0.0
    return np.clip(np.where(top, best, other), 0.0, 1.0).astype(np.float32)


@dataclass(frozen=True)
class _FilePayload:
    config: FasttextFilterConfig
    shard_index: int
    path: str
    threshold_key: int | None
    """keep_fraction mode, filtering pass: keep rank keys at or above this (None: scoring pass, or threshold mode)."""


def score_keys(scores: np.ndarray, texts: list[str]) -> np.ndarray:
    """One uint64 rank key per document: its float32 score's bits (ordered like the scores, which are
    non-negative) above the low 32 bits of a hash of its text, which breaks ties deterministically."""
    score_bits = np.asarray(scores, dtype=np.float32).view(np.uint32).astype(np.uint64)
    hashes = np.array([xxhash.xxh3_64_intdigest(text) & 0xFFFFFFFF for text in texts], dtype=np.uint64)
    return (score_bits << np.uint64(32)) | hashes


KEEP_NOTHING = (1 << 64) - 1
"""A threshold no key reaches: the largest score, 1.0, has float32 bits 0x3F800000."""


def top_fraction_threshold(shard_keys: Callable[[], Iterable[np.ndarray]], keep_fraction: float) -> int:
    """The key such that keeping keys at or above it keeps `round(keep_fraction * N)` of the N keys
    (more only where whole 64-bit keys are equal). `shard_keys()` yields every shard's keys, once per pass:
    a radix select, 16 bits per pass from the top, that never holds more than one shard's keys."""
    total = sum(len(keys) for keys in shard_keys())
    wanted = round(keep_fraction * total)
    if wanted <= 0:
        return KEEP_NOTHING
    if wanted >= total:
        return 0
    prefix, remaining, digits = 0, wanted, 1 << _DIGIT_BITS
    for shift in range(64 - _DIGIT_BITS, -1, -_DIGIT_BITS):
        histogram = np.zeros(digits, dtype=np.int64)
        for keys in shard_keys():
            if shift + _DIGIT_BITS < 64:
                keys = keys[(keys >> np.uint64(shift + _DIGIT_BITS)) == np.uint64(prefix)]
            histogram += np.bincount(((keys >> np.uint64(shift)) & np.uint64(digits - 1)).astype(np.int64),
                                     minlength=digits)  # fmt: skip
        at_or_above = np.cumsum(histogram[::-1])[::-1]
        digit = int(np.flatnonzero(at_or_above >= remaining)[-1])
        remaining -= int(at_or_above[digit] - histogram[digit])
        prefix = (prefix << _DIGIT_BITS) | digit
    return prefix


def _scores_path(config: FasttextFilterConfig, shard_index: int) -> str:
    return storage.join(config.output_path, "work", "scores", f"scores-{shard_index:05d}.npz")


def _score_shard(payload: _FilePayload, writer: ShardWriter) -> dict[str, Any]:
    report = ReadReport()
    texts = [document["text"] for document in read_documents(payload.path, report, payload.config.raw_input)]
    scores = score_texts(load_model(payload.config.model_path), texts, payload.config.label)
    save_arrays(writer, f"scores-{payload.shard_index:05d}.npz", score=scores, key=score_keys(scores, texts))
    return {"rows": len(scores)}


def _keep_shard(payload: _FilePayload, writer: ShardWriter) -> dict[str, Any]:
    config = payload.config
    report = ReadReport()
    documents = list(read_documents(payload.path, report, config.raw_input))
    if payload.threshold_key is not None:
        scored = load_arrays(_scores_path(config, payload.shard_index))
        scores, keep = scored["score"], scored["key"] >= np.uint64(payload.threshold_key)
    else:
        scores = score_texts(load_model(config.model_path), [document["text"] for document in documents], config.label)
        keep = scores >= (config.threshold or 0.0)
    kept = [document for document, chosen in zip(documents, keep, strict=True) if chosen]
    write_table(writer, shard_file(payload.shard_index), to_table(kept))
    score_table = pa.table({"id": [document["id"] for document in documents], "score": scores})
    write_table(writer, f"scores/shard-{payload.shard_index:05d}.parquet", score_table)
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = {"fasttext_below_threshold": len(documents) - len(kept)}
    return stats


def _check_label(config: FasttextFilterConfig) -> None:
    labels = sorted(load_model(config.model_path).get_labels())
    if config.label not in labels:
        raise ValueError(f"fasttext_filter at {config.output_path}: the model at {config.model_path} has no label "
                         f"{config.label!r}; its labels are {labels}. Set `label` to one of them.")  # fmt: skip


def fasttext_filter(config: FasttextFilterConfig) -> None:
    if (config.threshold is None) == (config.keep_fraction is None):
        raise ValueError("give exactly one of threshold and keep_fraction")
    _check_label(config)
    files = list_input_files(config.input_paths)
    threshold_key = None
    if config.keep_fraction is not None:
        score_shards = [Shard(f"{i:05d}", _FilePayload(config, i, path, None)) for i, path in enumerate(files)]
        run_sharded(storage.join(config.output_path, "work", "scores"), score_shards, _score_shard,
                    description="fasttext scores")  # fmt: skip

        def shard_keys() -> Iterator[np.ndarray]:
            return (load_arrays(_scores_path(config, index))["key"] for index in range(len(files)))

        threshold_key = top_fraction_threshold(shard_keys, config.keep_fraction)
    shards = [Shard(f"{i:05d}", _FilePayload(config, i, path, threshold_key)) for i, path in enumerate(files)]
    report = run_sharded(config.output_path, shards, _keep_shard, description="fasttext filter")
    stats = merge_stats(report)
    if threshold_key is None:
        stats["threshold"] = config.threshold
    else:  # the score at the cut (its float32 bits are the key's top half)
        stats["threshold"] = float(np.uint32(min(threshold_key >> 32, 0xFFFFFFFF)).view(np.float32))
    stats["keep_fraction"] = config.keep_fraction
    write_stats(config.output_path, stats)
