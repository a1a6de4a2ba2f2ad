"""Exact dedup of documents and of paragraphs, keeping the first occurrence in input order.

"Exact" is after light normalization: runs of whitespace collapse to one space and the ends are
stripped, so reflowed copies still match; case and punctuation count. A paragraph is a run of
text between blank lines; paragraphs shorter than `min_paragraph_chars` are never removed (a lone
`}` or `return None` is not content worth deduplicating).

Three stages, each committed shard by shard with `run_sharded`, none holding all data at once:

1. hash (one shard per input file): a 64-bit xxh3 of each document and each paragraph, written
   into `partitions` hash-range files: (hash, document key, paragraph index; -1 for the document).
2. resolve (one shard per hash partition): sort by (hash, document key, paragraph); every entry but
   the first of its hash is a removal, written per input file.
3. rewrite (one shard per input file): drop documents removed whole; cut removed paragraphs out
   (with the blank lines after them) and record the cut character spans of the original text in
   `removed/shard-SSSSS.parquet` (id, spans); a document left empty is dropped.

Output: `docs/shard-*.parquet`, `removed/shard-*.parquet`, `stats.json` with per-reason drop counts.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from executor import storage
from executor.shards import Shard, ShardWriter, run_sharded
from steps.connected_components import load_arrays, save_arrays
from steps.documents import (
    FileShard,
    ReadReport,
    doc_key,
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

logger = logging.getLogger(__name__)

_PARAGRAPH = re.compile(r"\S(?:[^\n]|\n(?![ \t]*\n))*")
"""A paragraph: from a non-space character to just before the next blank line."""
_SPACES = re.compile(r"\s+")
_DOC_SEED = 0
_PARAGRAPH_SEED = 1


@dataclass(frozen=True)
class ExactDedupConfig:
    input_paths: list[str]
    """Document files, folders or globs (JSONL or Parquet), read in this order: earlier documents win."""
    output_path: str
    """Where docs/, removed/ and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    paragraphs: bool = True
    """Also remove repeated paragraphs (not only whole documents). Versioned."""
    min_paragraph_chars: int = 64
    """Shorter paragraphs are never removed. Versioned."""
    partitions: int = 4
    """Hash partitions for stage 2. Layout only."""
    raw_input: bool = True
    """Whether an input file with no usable document is an error (False for our own outputs)."""


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each paragraph, end exclusive, blank lines excluded."""
    return [(match.start(), match.start() + len(match.group().rstrip())) for match in _PARAGRAPH.finditer(text)]


def _hash(text: str, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(_SPACES.sub(" ", text).strip(), seed=seed)


def _hash_shard(payload: FileShard[ExactDedupConfig], writer: ShardWriter) -> dict[str, object]:
    config = payload.config
    hashes, keys, paragraphs = [], [], []
    report = ReadReport()
    for row, document in enumerate(read_documents(payload.path, report, config.raw_input)):
        key = doc_key(payload.shard_index, row)
        hashes.append(_hash(document["text"], _DOC_SEED))
        keys.append(key)
        paragraphs.append(-1)
        if config.paragraphs:
            for index, (start, end) in enumerate(paragraph_spans(document["text"])):
                if end - start >= config.min_paragraph_chars:
                    hashes.append(_hash(document["text"][start:end], _PARAGRAPH_SEED))
                    keys.append(key)
                    paragraphs.append(index)
    hash_array = np.array(hashes, dtype=np.uint64)
    key_array, paragraph_array = np.array(keys, dtype=np.int64), np.array(paragraphs, dtype=np.int32)
    owners = hash_array % np.uint64(config.partitions)
    for partition in range(config.partitions):
        chosen = owners == partition
        save_arrays(writer, f"from-{payload.shard_index:05d}/p{partition:04d}.npz",
                    hash=hash_array[chosen], doc=key_array[chosen], paragraph=paragraph_array[chosen])  # fmt: skip
    return {"rows": len(hashes), "hashed_paragraphs": int(np.sum(paragraph_array >= 0))}


@dataclass(frozen=True)
class _PartitionPayload:
    hashes_folder: str
    partition: int


def _resolve_shard(payload: _PartitionPayload, writer: ShardWriter) -> dict[str, int]:
    fs, fs_path = storage.filesystem(payload.hashes_folder)
    parts: dict[str, list[np.ndarray]] = {"hash": [], "doc": [], "paragraph": []}
    for path in sorted(fs.glob(f"{fs_path}/from-*/p{payload.partition:04d}.npz")):
        arrays = load_arrays(fs.unstrip_protocol(path) if storage.is_url(payload.hashes_folder) else path)
        for name, values in parts.items():
            values.append(arrays[name])
    hashes, docs, paragraphs = (np.concatenate(parts[name]) for name in ("hash", "doc", "paragraph"))
    order = np.lexsort((paragraphs, docs, hashes))
    hashes, docs, paragraphs = hashes[order], docs[order], paragraphs[order]
    repeat = np.concatenate([[False], hashes[1:] == hashes[:-1]]) if len(hashes) else np.zeros(0, bool)
    docs, paragraphs = docs[repeat], paragraphs[repeat]
    shards = docs >> 32
    for shard_index in np.unique(shards):
        chosen = shards == shard_index
        save_arrays(writer, f"from-{payload.partition:04d}/shard-{int(shard_index):05d}.npz",
                    doc=docs[chosen], paragraph=paragraphs[chosen])  # fmt: skip
    return {"rows": int(repeat.sum())}


def _removals(folder: str, shard_index: int) -> dict[int, set[int]]:
    """Document key -> paragraph indexes to remove (-1: the whole document)."""
    fs, fs_path = storage.filesystem(folder)
    removals: dict[int, set[int]] = {}
    for path in sorted(fs.glob(f"{fs_path}/from-*/shard-{shard_index:05d}.npz")):
        arrays = load_arrays(fs.unstrip_protocol(path) if storage.is_url(folder) else path)
        for key, paragraph in zip(arrays["doc"].tolist(), arrays["paragraph"].tolist(), strict=True):
            removals.setdefault(key, set()).add(paragraph)
    return removals


def _cut(text: str, remove: set[int]) -> tuple[str, list[list[int]]]:
    """`text` without the chosen paragraphs (each with the blank lines after it); the cut spans."""
    spans = paragraph_spans(text)
    pieces, cuts, position = [], [], 0
    for index, (start, _end) in enumerate(spans):
        if index in remove:
            stop = spans[index + 1][0] if index + 1 < len(spans) else len(text)
            pieces.append(text[position:start])
            cuts.append([start, stop])
            position = stop
    pieces.append(text[position:])
    return "".join(pieces), cuts


def _rewrite_shard(payload: FileShard[ExactDedupConfig], writer: ShardWriter) -> dict[str, object]:
    removals = _removals(storage.join(payload.config.output_path, "work", "removals"), payload.shard_index)
    report = ReadReport()
    kept, removed = [], []
    dropped = {"exact_duplicate": 0, "all_paragraphs_duplicate": 0}
    paragraphs_removed = 0
    for row, document in enumerate(read_documents(payload.path, report, payload.config.raw_input)):
        remove = removals.get(doc_key(payload.shard_index, row), set())
        if -1 in remove:
            dropped["exact_duplicate"] += 1
            continue
        if remove:
            text, cuts = _cut(document["text"], remove)
            paragraphs_removed += len(cuts)
            removed.append({"id": document["id"], "spans": cuts})
            if not text.strip():
                dropped["all_paragraphs_duplicate"] += 1
                continue
            document = {**document, "text": text}
        kept.append(document)
    write_table(writer, shard_file(payload.shard_index), to_table(kept))
    schema = pa.schema([("id", pa.string()), ("spans", pa.list_(pa.list_(pa.int64())))])
    removed_table = pa.Table.from_pylist(removed, schema=schema)
    write_table(writer, f"removed/shard-{payload.shard_index:05d}.parquet", removed_table)
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = dropped
    stats["paragraphs_removed"] = paragraphs_removed
    return stats


def exact_dedup(config: ExactDedupConfig) -> None:
    files = list_input_files(config.input_paths)
    work = storage.join(config.output_path, "work")
    per_file = file_shards(config, files)
    hashes_folder = storage.join(work, "hashes")
    run_sharded(hashes_folder, per_file, _hash_shard, description="exact dedup: hash")
    partition_shards = [Shard(f"{p:04d}", _PartitionPayload(hashes_folder, p)) for p in range(config.partitions)]
    run_sharded(storage.join(work, "removals"), partition_shards, _resolve_shard, description="exact dedup: resolve")
    report = run_sharded(config.output_path, per_file, _rewrite_shard, description="exact dedup: rewrite")
    stats = merge_stats(report)
    stats["settings"] = {"paragraphs": config.paragraphs, "min_paragraph_chars": config.min_paragraph_chars}
    write_stats(config.output_path, stats)
