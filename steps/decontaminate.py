"""Decontamination: drop training documents that share too many n-grams with evaluation sets.

Eval documents are shingled into word n-grams (13 by default, as in GPT-3's decontamination) with
the same normalization and hashing as MinHash (`steps/minhash.py`), giving a sorted array of 64-bit
n-gram hashes that every shard loads (eval sets are small next to training data). A training
document is dropped when the fraction of its n-grams found in that array exceeds `threshold`
(0.0: any shared n-gram). Lookups are one `np.isin` per batch of documents.

Output: `docs/shard-*.parquet`, `contaminated/shard-*.parquet` (id, overlap), `stats.json`.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from executor.shards import ShardWriter, run_sharded
from steps.documents import (
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
from steps.minhash import shingles

logger = logging.getLogger(__name__)


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
    raw_input: bool = False
    """Whether an input file with no usable document is an error (True for raw downloads)."""


@functools.cache
def eval_ngrams(eval_paths: tuple[str, ...], n_grams: int) -> np.ndarray:
    """Sorted unique n-gram hashes of every eval document (cached per worker process)."""
    report = ReadReport()
    texts = [document["text"] for path in list_input_files(list(eval_paths))
             for document in read_documents(path, report, raw=False)]  # fmt: skip
    hashes, _offsets = shingles(texts, n_grams)
    logger.info("%d eval docs, %d distinct %d-grams", len(texts), len(np.unique(hashes)), n_grams)
    return np.unique(hashes)


def overlaps(texts: list[str], reference: np.ndarray, n_grams: int) -> np.ndarray:
    """For each text, the fraction of its n-grams that occur in `reference` (0 if it has none)."""
    hashes, offsets = shingles(texts, n_grams)
    found = np.isin(hashes, reference).astype(np.int64)
    sums = np.concatenate([[0], np.cumsum(found)])
    counts = offsets[1:] - offsets[:-1]
    hits = sums[offsets[1:]] - sums[offsets[:-1]]
    return np.where(counts > 0, hits / np.maximum(counts, 1), 0.0)


def _decontaminate_shard(payload: FileShard[DecontaminateConfig], writer: ShardWriter) -> dict[str, object]:
    config = payload.config
    report = ReadReport()
    documents = list(read_documents(payload.path, report, config.raw_input))
    reference = eval_ngrams(tuple(config.eval_paths), config.n_grams)
    fractions = overlaps([document["text"] for document in documents], reference, config.n_grams)
    dropped = fractions > config.threshold
    kept = [document for document, drop in zip(documents, dropped, strict=True) if not drop]
    write_table(writer, shard_file(payload.shard_index), to_table(kept))
    contaminated = pa.table({"id": [d["id"] for d, drop in zip(documents, dropped, strict=True) if drop],
                             "overlap": fractions[dropped].astype(np.float64)})  # fmt: skip
    write_table(writer, f"contaminated/shard-{payload.shard_index:05d}.parquet", contaminated)
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = {"contaminated": int(dropped.sum())}
    return stats


def decontaminate(config: DecontaminateConfig) -> None:
    if not config.eval_paths:
        raise ValueError("eval_paths is empty; give at least one evaluation set")
    files = list_input_files(config.input_paths)
    shards = file_shards(config, files)
    report = run_sharded(config.output_path, shards, _decontaminate_shard, description="decontaminate")
    stats = merge_stats(report)
    stats["eval_ngrams"] = len(eval_ngrams(tuple(config.eval_paths), config.n_grams))
    write_stats(config.output_path, stats)
