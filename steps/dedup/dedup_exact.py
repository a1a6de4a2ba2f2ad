"""Exact dedup of documents and of paragraphs, keeping the first occurrence in input order.

"Exact" is after light normalization: runs of whitespace collapse to one space and the ends are
stripped, so reflowed copies still match; case and punctuation count. A paragraph is a run of
text between blank lines, whether lines end in "\n", "\r\n" or "\r" (spans stay offsets into the
original text, which is written back unchanged); paragraphs shorter than `min_paragraph_chars` are never removed (a lone
`}` or `return None` is not content worth deduplicating).

Three stages, each committed shard by shard with `run_sharded`, none holding all data at once:

1. hash (one shard per input file S): a 64-bit xxh3 of each document and each paragraph (normalised and fed
   to the hash `hash_window_chars` at a time, so a 50 MB document costs a window's copies), written
   into `partitions` hash-range files, `work/hashes/to-PPPP/from-S.npz`: (hash, document key,
   paragraph index; -1 for the document).
2. resolve (one shard per hash partition P, reading only its own folder): sort by (hash, document
   key, paragraph); every entry but the first of its hash is a removal, written per input file to
   `work/removals/to-S/from-P.npz`.
3. rewrite (one shard per input file): drop documents removed whole; cut removed paragraphs out
   (with the blank lines after them) and record the cut character spans of the original text in
   `removed/shard-SSSSS.parquet` (id, spans); a document left empty is dropped.

`partitions` defaults to a count sized from the input: a resolve shard holds ~80 bytes per entry
(20 stored, the sort and its sorted copies), and there are at most one entry per document plus one
per `min_paragraph_chars` of text.

Output: `docs/shard-*.parquet`, `removed/shard-*.parquet`, `stats.json` with per-reason drop counts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from executor import Shard, ShardWriter, storage
from steps.data.arrays import DEFAULT_SHARD_MEMORY_BYTES, column, load_routed, partitions_for, run_stage, save_routed
from steps.data.documents import (
    MEAN_DOC_BYTES_FLOOR,
    FileShard,
    ReadReport,
    doc_key,
    estimated_documents,
    file_shards,
    flow_stats,
    list_source_files,
    merge_stats,
    read_documents,
    shard_file,
    source_stats,
    text_bytes,
    to_table,
    write_stats,
    write_table,
)

logger = logging.getLogger(__name__)

_BREAK = r"(?>\r\n|\r|\n)"
"""A line break of any convention (atomic: "\r\n" is one break, never "\r" then "\n", i.e. never a blank line)."""
_BLANK_LINE = re.compile(rf"{_BREAK}[ \t]*{_BREAK}")
"""What ends a paragraph: a line break, spaces or tabs at most, and another line break."""
_NON_SPACE = re.compile(r"\S")
_SPACES = re.compile(r"\s+")
HASH_WINDOW_CHARS = 1 << 20
"""`ExactDedupConfig.hash_window_chars`' default: a window's normalised copies are a few MB."""
RESOLVE_BYTES_PER_ENTRY = 80
"""Working set of a resolve shard per (hash, document, paragraph) entry: 20 bytes stored, the concatenation,
the lexsort order and the sorted copies."""
_DOC_SEED = 0
_PARAGRAPH_SEED = 1


@dataclass(frozen=True)
class ExactDedupConfig:
    input_paths: list[str]
    """Document files, folders or globs (JSONL or Parquet), read in this order: earlier documents win."""
    output_path: str
    """Where docs/, removed/ and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    input_sources: list[str] | None = None
    """A source name for each entry of `input_paths` (one step over many sources): the kept documents of the
    files under `input_paths[i]` go to `docs/<input_sources[i]>/`, so each source's later steps read their own
    folder, and `stats.json` counts documents by source. None: one `docs/` folder. Versioned."""
    paragraphs: bool = True
    """Also remove repeated paragraphs (not only whole documents). Versioned."""
    min_paragraph_chars: int = 64
    """Shorter paragraphs are never removed. Versioned."""
    partitions: int | None = None
    """Hash partitions for stage 2; None sizes them from the input for `shard_memory_bytes`. Layout only."""
    shard_memory_bytes: int = DEFAULT_SHARD_MEMORY_BYTES
    """The working set a resolve shard is sized for (see steps/README.md). Layout only."""
    parallelism: str = "auto"
    """How shards run: "auto" (Ray if initialized, else processes), "process" or "thread". Layout only."""
    raw_input: bool = True
    """Whether an input file with no usable document is an error (False for our own outputs)."""
    hash_window_chars: int = HASH_WINDOW_CHARS
    """Documents and paragraphs are normalised and fed to the hash this many characters at a time
    (`text_hash`), so that a shard holds a window's copies, never a whole document's (a 50 MB document
    hashed whole held 3.8 GB); the hash is that of the whole normalised text whatever the window.
    stats.json counts `windowed_documents`, those longer than one window. Layout only."""


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each paragraph, end exclusive, blank lines excluded: from a non-space character to just
    before the next blank line (`_BLANK_LINE`), trailing whitespace left out. Found with two plain searches per
    paragraph: a pattern that matched the paragraph itself, one character at a time up to a blank line, kept a
    backtracking frame per character (36 bytes: 1.8 GB for a 50 MB paragraph)."""
    spans, position = [], 0
    while (first := _NON_SPACE.search(text, position)) is not None:
        blank = _BLANK_LINE.search(text, first.start() + 1)
        position = blank.start() if blank else len(text)
        end = position
        while text[end - 1].isspace():
            end -= 1
        spans.append((first.start(), end))
    return spans


def text_hash(text: str, seed: int, window: int = HASH_WINDOW_CHARS, start: int = 0, end: int | None = None) -> int:
    """The 64-bit xxh3 of `text[start:end]` normalised (runs of whitespace as one space, the ends stripped), the
    normalised text fed to the hash `window` characters of the original at a time: the hash of the whole."""
    end = len(text) if end is None else end
    if end - start <= window:
        return xxhash.xxh3_64_intdigest(_SPACES.sub(" ", text[start:end]).strip(), seed=seed)
    hasher = xxhash.xxh3_64(seed=seed)
    for part in _normalised(text, start, end, window):
        hasher.update(part.encode("utf-8"))
    return hasher.intdigest()


def _normalised(text: str, start: int, end: int, window: int) -> Iterator[str]:
    """`_SPACES.sub(" ", text[start:end]).strip()` in parts, one window of `text` at a time: a run of
    whitespace that crosses windows is still one space, and none is written before the first word or after
    the last."""
    words_before = space_pending = False
    for low in range(start, end, window):
        part = _SPACES.sub(" ", text[low : min(end, low + window)])
        words = part.strip(" ")  # after the substitution, a space is the only whitespace left
        if not words:
            space_pending = True
            continue
        if words_before and (space_pending or part[0] == " "):
            yield " "
        yield words
        words_before, space_pending = True, part[-1] == " "


def _hash_shard(payload: _HashPayload, writer: ShardWriter) -> dict[str, object]:
    config, shard_index = payload.file.config, payload.file.shard_index
    hashes, keys, paragraphs = [], [], []
    report = ReadReport()
    window, windowed = config.hash_window_chars, 0
    for row, document in enumerate(read_documents(payload.file.path, report, config.raw_input)):
        key, text = doc_key(shard_index, row), document["text"]
        hashes.append(text_hash(text, _DOC_SEED, window))
        windowed += len(text) > window
        keys.append(key)
        paragraphs.append(-1)
        if config.paragraphs:
            for index, (start, end) in enumerate(paragraph_spans(text)):
                if end - start >= config.min_paragraph_chars:
                    hashes.append(text_hash(text, _PARAGRAPH_SEED, window, start, end))
                    keys.append(key)
                    paragraphs.append(index)
    hash_array = np.array(hashes, dtype=np.uint64)
    save_routed(writer, f"{shard_index:05d}", (hash_array % np.uint64(payload.partitions)).astype(np.int64),
                _partition_name, hash=hash_array, doc=np.array(keys, dtype=np.int64),
                paragraph=np.array(paragraphs, dtype=np.int32))  # fmt: skip
    return {"rows": len(hashes), "hashed_paragraphs": sum(index >= 0 for index in paragraphs),
            "windowed_documents": windowed}  # fmt: skip


def _partition_name(partition: int) -> str:
    return f"{partition:04d}"


@dataclass(frozen=True)
class _PartitionPayload:
    hashes_folder: str
    partition: int


def _resolve_shard(payload: _PartitionPayload, writer: ShardWriter) -> dict[str, int]:
    loaded = load_routed(payload.hashes_folder, _partition_name(payload.partition))
    hashes = column(loaded, "hash", np.zeros(0, np.uint64))
    docs, paragraphs = column(loaded, "doc", np.zeros(0, np.int64)), column(loaded, "paragraph", np.zeros(0, np.int32))
    order = np.lexsort((paragraphs, docs, hashes))
    hashes, docs, paragraphs = hashes[order], docs[order], paragraphs[order]
    repeat = np.concatenate([[False], hashes[1:] == hashes[:-1]]) if len(hashes) else np.zeros(0, bool)
    save_routed(writer, _partition_name(payload.partition), docs[repeat] >> np.int64(32), lambda shard: f"{shard:05d}",
                doc=docs[repeat], paragraph=paragraphs[repeat])  # fmt: skip
    return {"rows": int(repeat.sum())}


def _removals(folder: str, shard_index: int) -> dict[int, set[int]]:
    """Document key -> paragraph indexes to remove (-1: the whole document)."""
    removals: dict[int, set[int]] = {}
    for arrays in load_routed(folder, f"{shard_index:05d}"):
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
    write_table(writer, shard_file(payload.shard_index, payload.source), to_table(kept))
    schema = pa.schema([("id", pa.string()), ("spans", pa.list_(pa.list_(pa.int64())))])
    removed_table = pa.Table.from_pylist(removed, schema=schema)
    write_table(writer, f"removed/shard-{payload.shard_index:05d}.parquet", removed_table)
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = dropped
    stats["paragraphs_removed"] = paragraphs_removed
    stats.update(source_stats(payload.source, report.docs, len(kept)))
    return stats


@dataclass(frozen=True)
class _HashPayload:
    file: FileShard[ExactDedupConfig]
    partitions: int


def _partitions(config: ExactDedupConfig, files: list[str]) -> int:
    if config.partitions:
        return config.partitions
    documents = estimated_documents(files)
    # At most one paragraph entry per `min_paragraph_chars` of text, and MEAN_DOC_BYTES_FLOOR bytes per document.
    paragraphs = documents * MEAN_DOC_BYTES_FLOOR // config.min_paragraph_chars if config.paragraphs else 0
    entries = documents + paragraphs
    return partitions_for(entries, RESOLVE_BYTES_PER_ENTRY, config.shard_memory_bytes)


def exact_dedup(config: ExactDedupConfig) -> None:
    if config.hash_window_chars < 1:
        raise ValueError(f"exact dedup at {config.output_path}: hash_window_chars must be 1 or more, got "
                         f"{config.hash_window_chars}")  # fmt: skip
    files, sources = list_source_files(config.input_paths, config.input_sources, f"exact dedup at {config.output_path}")
    partitions = _partitions(config, files)
    work = storage.join(config.output_path, "work")
    per_file = file_shards(config, files, sources)
    hashes_folder = storage.join(work, "hashes")
    hash_shards = [Shard(shard.shard_id, _HashPayload(shard.payload, partitions)) for shard in per_file]
    hashed = run_stage(config, hashes_folder, hash_shards, _hash_shard, "exact dedup: hash")
    partition_shards = [Shard(_partition_name(p), _PartitionPayload(hashes_folder, p)) for p in range(partitions)]
    run_stage(config, storage.join(work, "removals"), partition_shards, _resolve_shard, "exact dedup: resolve")
    report = run_stage(config, config.output_path, per_file, _rewrite_shard, "exact dedup: rewrite")
    stats = merge_stats(report)
    stats["windowed_documents"] = merge_stats(hashed).get("windowed_documents", 0)
    stats["layout"] = {"partitions": partitions, "hash_window_chars": config.hash_window_chars}
    stats["settings"] = {"paragraphs": config.paragraphs, "min_paragraph_chars": config.min_paragraph_chars}
    write_stats(config.output_path, stats)
