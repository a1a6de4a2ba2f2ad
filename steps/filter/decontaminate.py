"""Decontamination: drop training documents that share too many n-grams with evaluation sets.

Eval items are shingled into word n-grams (13 by default, as in GPT-3's decontamination) with the
same normalization and hashing as MinHash (`steps/dedup/minhash.py`), giving a sorted array of 64-bit
n-gram hashes that every shard loads (eval sets are small next to training data). A training
document is dropped when the fraction of its n-grams found in that array exceeds `threshold`
(0.0: any shared n-gram). Lookups are one `np.isin` per batch of documents.

Short eval items: an item of fewer than `n_grams` words has no n-gram and used to be missed
silently. An item of w words, `min_n_grams <= w < n_grams`, is matched whole instead: its single
w-gram is looked up among the training document's w-grams, and any hit drops the document (GPT-3
clamped n per dataset to 8-13 for the same reason). Items shorter than `min_n_grams` ("yes",
"Paris") would match too much ordinary text to be evidence of a leak; they are not checked, and
`stats.json` says how many there were (`eval_items.too_short`).

Memory: documents are shingled in batches of at most `BATCH_CHARS` characters, and a document
longer than `WINDOW_CHARS` is checked in windows that overlap by `WINDOW_OVERLAP_CHARS` (so an
n-gram across a window edge is still seen), so a worker's shingling peak stays near 48 bytes x
`BATCH_CHARS` however large a file or document is.

Output: `docs/shard-*.parquet`, `contaminated/shard-*.parquet` (id, overlap), `stats.json`.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from executor import ShardWriter, run_sharded
from steps.data.documents import (
    FileShard,
    ReadReport,
    file_shards,
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
from steps.dedup.minhash import BATCH_CHARS, normalize, shingles, text_batches

logger = logging.getLogger(__name__)

WINDOW_CHARS = 500_000
"""Longer training documents are checked window by window."""
WINDOW_OVERLAP_CHARS = 2_000
"""Consecutive windows share this many characters: far more than any 13 words."""


@dataclass(frozen=True)
class DecontaminateConfig:
    input_paths: list[str]
    """Training documents (files, folders or globs)."""
    eval_paths: list[str]
    """Evaluation documents whose n-grams must not leak into training."""
    output_path: str
    """Where docs/, contaminated/ and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    n_grams: int = 13
    """Words per n-gram. Versioned."""
    threshold: float = 0.0
    """Drop a document when more than this fraction of its n-grams occur in an eval set. Versioned."""
    min_n_grams: int = 8
    """Eval items of at least this many (and fewer than `n_grams`) words are matched whole; shorter ones are
    counted as too short to check. Versioned."""
    raw_input: bool = False
    """Whether an input file with no usable document is an error (True for raw downloads)."""


@dataclass(frozen=True)
class EvalReference:
    """What training documents are checked against, built once per worker process."""

    ngrams: np.ndarray
    """Sorted unique `n_grams`-gram hashes of the items that have them."""
    whole: dict[int, np.ndarray]
    """For each word count w in [min_n_grams, n_grams): sorted hashes of the w-word items, each one w-gram."""
    items: dict[str, int]
    """How many items were checked by n-grams, checked whole, or too short to check."""


@functools.cache
def eval_reference(eval_paths: tuple[str, ...], n_grams: int, min_n_grams: int) -> EvalReference:
    report = ReadReport()
    texts = [document["text"] for path in list_input_files(list(eval_paths))
             for document in read_documents(path, report, raw=False)]  # fmt: skip
    words = [len(normalize(text).split()) for text in texts]
    long_items = [text for text, count in zip(texts, words, strict=True) if count >= n_grams]
    parts = [shingles(batch, n_grams)[0] for batch in text_batches(long_items, BATCH_CHARS)]
    ngrams = np.unique(np.concatenate([np.zeros(0, np.uint64), *parts]))
    whole = {}
    for count in sorted({count for count in words if min_n_grams <= count < n_grams}):
        whole[count] = np.unique(shingles([text for text, w in zip(texts, words, strict=True) if w == count], count)[0])
    items = {"checked_by_ngrams": len(long_items), "checked_whole": sum(min_n_grams <= w < n_grams for w in words),
             "too_short": sum(w < min_n_grams for w in words)}  # fmt: skip
    logger.info("%d eval items (%s), %d distinct %d-grams", len(texts), items, len(ngrams), n_grams)
    return EvalReference(ngrams, whole, items)


def _hits(texts: list[str], reference: np.ndarray, n_grams: int) -> tuple[np.ndarray, np.ndarray]:
    """For each text, (how many of its n-grams occur in `reference`, how many n-grams it has)."""
    hashes, offsets = shingles(texts, n_grams)
    sums = np.concatenate([[0], np.cumsum(np.isin(hashes, reference))])
    return sums[offsets[1:]] - sums[offsets[:-1]], offsets[1:] - offsets[:-1]


def _windows(texts: list[str]) -> tuple[list[str], np.ndarray]:
    """The texts cut into overlapping windows of at most WINDOW_CHARS characters, and each window's text index."""
    step = WINDOW_CHARS - WINDOW_OVERLAP_CHARS
    windows, owners = [], []
    for index, text in enumerate(texts):
        for start in range(0, max(len(text) - WINDOW_OVERLAP_CHARS, 1), step):
            windows.append(text[start : start + WINDOW_CHARS])
            owners.append(index)
    return windows, np.array(owners, dtype=np.int64)


def contamination(texts: list[str], reference: EvalReference, n_grams: int) -> tuple[np.ndarray, np.ndarray]:
    """For each text, (fraction of its n-grams found in the eval n-grams, whether it holds a short item whole)."""
    windows, owners = _windows(texts)
    hits, counts = np.zeros(len(texts), np.int64), np.zeros(len(texts), np.int64)
    whole = np.zeros(len(texts), bool)
    start = 0
    for batch in text_batches(windows, BATCH_CHARS):
        batch_owners, start = owners[start : start + len(batch)], start + len(batch)
        batch_hits, batch_counts = _hits(batch, reference.ngrams, n_grams)
        np.add.at(hits, batch_owners, batch_hits)
        np.add.at(counts, batch_owners, batch_counts)
        for words, hashes in reference.whole.items():
            np.logical_or.at(whole, batch_owners, _hits(batch, hashes, words)[0] > 0)
    return np.where(counts > 0, hits / np.maximum(counts, 1), 0.0), whole


def _decontaminate_shard(payload: FileShard[DecontaminateConfig], writer: ShardWriter) -> dict[str, object]:
    config = payload.config
    report = ReadReport()
    documents = list(read_documents(payload.path, report, config.raw_input))
    reference = eval_reference(tuple(config.eval_paths), config.n_grams, config.min_n_grams)
    fractions, whole = contamination([document["text"] for document in documents], reference, config.n_grams)
    dropped = (fractions > config.threshold) | whole
    kept = [document for document, drop in zip(documents, dropped, strict=True) if not drop]
    write_table(writer, shard_file(payload.shard_index), to_table(kept))
    contaminated = pa.table({"id": [d["id"] for d, drop in zip(documents, dropped, strict=True) if drop],
                             "overlap": fractions[dropped].astype(np.float64)})  # fmt: skip
    write_table(writer, f"contaminated/shard-{payload.shard_index:05d}.parquet", contaminated)
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = {"contaminated": int(dropped.sum())}
    stats["contaminated_by_whole_item"] = int(whole.sum())
    return stats


def decontaminate(config: DecontaminateConfig) -> None:
    if not config.eval_paths:
        raise ValueError("eval_paths is empty; give at least one evaluation set")
    if not 1 <= config.min_n_grams <= config.n_grams:
        raise ValueError(f"min_n_grams must be in [1, n_grams={config.n_grams}], got {config.min_n_grams}")
    files = list_input_files(config.input_paths)
    shards = file_shards(config, files)
    report = run_sharded(config.output_path, shards, _decontaminate_shard, description="decontaminate")
    stats = merge_stats(report)
    reference = eval_reference(tuple(config.eval_paths), config.n_grams, config.min_n_grams)
    stats["eval_ngrams"] = len(reference.ngrams)
    stats["eval_items"] = reference.items
    if reference.items["too_short"]:
        logger.warning("%s: %d eval item(s) have fewer than %d words and were not checked", config.output_path,
                       reference.items["too_short"], config.min_n_grams)  # fmt: skip
    write_stats(config.output_path, stats)
