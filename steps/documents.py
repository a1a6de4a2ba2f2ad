"""The document format every data step reads and writes, and the bookkeeping of bad input.

Input: JSONL (plain, `.gz`, `.zst`) or Parquet, at any fsspec URL: a file, a folder (searched
recursively) or a glob. Each document has a string `id` and `text`, and optionally `source` and
`metadata` (any JSON value). Output: `docs/shard-00000.parquet`, ... (zstd) with the stable
schema `SCHEMA`; `metadata` is stored as JSON text so the schema never depends on the data.

Bad input is counted, sampled and reported, never silently passed on or dropped: a line that is
not valid UTF-8 (`invalid_utf8`), not a JSON object (`malformed_json`), without a string `text`
(`missing_text`) or whose text is only whitespace (`empty_text`). `ReadReport` keeps the counts
and the first few samples (file, line, reason, excerpt), which end up in the step's stats.json.
A raw input file whose lines are all bad, or which has no line at all, is an error naming it.

Documents are ordered by (input file in sorted order, line): `doc_key(shard, row)` packs that
order into one int64, so "keep the first occurrence" means "keep the smallest key" everywhere.
"""

from __future__ import annotations

import builtins
import gzip
import io
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from executor import storage
from executor.shards import Shard, ShardReport, ShardWriter

logger = logging.getLogger(__name__)

SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("metadata", pa.string()),
    ]
)
DOCS_DIR = "docs"
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst", ".parquet")
MAX_SAMPLES = 5
BYTES_PER_TOKEN = 4
"""A tokens estimate for stats: about four bytes of English text per BPE token."""


class BadInputError(ValueError):
    """An input file with no usable document (all lines bad, or none at all)."""


@dataclass
class ReadReport:
    """Counts of what was read and of every kind of bad line, with a few samples."""

    docs: int = 0
    bytes: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def reject(self, path: str, line: int, reason: str, raw: builtins.bytes | str) -> None:
        self.bad[reason] += 1
        if len(self.samples) < MAX_SAMPLES:
            excerpt = raw[:160] if isinstance(raw, str) else raw[:160].decode("utf-8", "backslashreplace")
            self.samples.append({"file": path, "line": line, "reason": reason, "excerpt": excerpt})
        logger.debug("%s:%d: %s", path, line, reason)


@dataclass(frozen=True)
class FileShard[ConfigT]:
    """One input file of a step that runs a shard per file: the step's config, the file's index and path."""

    config: ConfigT
    shard_index: int
    path: str


def file_shards[ConfigT](config: ConfigT, files: Sequence[str]) -> list[Shard]:
    """One shard per input file, named by its position (so a restart finds the same shard ids)."""
    return [Shard(f"{index:05d}", FileShard(config, index, path)) for index, path in enumerate(files)]


def doc_key(shard_index: int, row: int) -> int:
    """One int64 that orders documents by (shard, row): 2^31 shards of 2^32 rows."""
    return (shard_index << 32) | row


def split_key(key: int) -> tuple[int, int]:
    return key >> 32, key & 0xFFFFFFFF


def list_input_files(input_paths: str | Sequence[str]) -> list[str]:
    """Every supported document file under each path (file, folder or glob), sorted per path."""
    found: list[str] = []
    for input_path in [input_paths] if isinstance(input_paths, str) else input_paths:
        fs, fs_path = storage.filesystem(input_path)
        if any(char in fs_path for char in "*?["):
            names = sorted(fs.glob(fs_path))
        elif fs.isdir(fs_path):
            names = sorted(fs.find(fs_path))
        elif fs.exists(fs_path):
            names = [fs_path]
        else:
            raise FileNotFoundError(f"input path {input_path} does not exist; check the URL or the upstream step")
        files = [_unstrip(input_path, fs, name) for name in names if _is_document_file(name)]
        if not files:
            raise FileNotFoundError(f"no document files ({', '.join(SUFFIXES)}) under {input_path}")
        found.extend(files)
    return found


def _unstrip(input_path: str, fs: Any, name: str) -> str:
    return fs.unstrip_protocol(name) if storage.is_url(input_path) else name


def _is_document_file(name: str) -> bool:
    parts = name.split("/")
    hidden = any(part.startswith(".") for part in parts)
    return not hidden and name.endswith(SUFFIXES)


def read_documents(path: str, report: ReadReport, raw: bool = True) -> Iterator[dict[str, Any]]:
    """Good documents of one file, counting bad lines in `report`.

    With `raw`, a file that yields no document is a `BadInputError`; our own Parquet outputs pass
    `raw=False`, since a shard that upstream filtering emptied is legitimate.
    """
    docs_before, bad_before = report.docs, sum(report.bad.values())
    if path.endswith(".parquet"):
        yield from _read_parquet(path, report)
    else:
        yield from _read_jsonl(path, report)
    if raw and report.docs == docs_before:
        bad = sum(report.bad.values()) - bad_before
        what = f"all {bad} of its lines are bad ({dict(report.bad)})" if bad else "it is empty"
        raise BadInputError(f"input file {path} has no usable document: {what}; samples: {report.samples[:3]}")


def _open_bytes(path: str) -> bytes:
    data = storage.read_bytes(path)
    if data is None:
        raise FileNotFoundError(f"input file {path} is gone (listed, then missing)")
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            return reader.read()
    return data


def _read_jsonl(path: str, report: ReadReport) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(_open_bytes(path).split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            report.reject(path, number, "invalid_utf8", line)
            continue
        except ValueError:
            report.reject(path, number, "malformed_json", line)
            continue
        document = _validate(record, path, number, report, line)
        if document is not None:
            yield document


def _read_parquet(path: str, report: ReadReport) -> Iterator[dict[str, Any]]:
    table = pq.read_table(io.BytesIO(_open_bytes(path)))
    columns = set(table.column_names)
    for number, record in enumerate(table.to_pylist(), start=1):
        metadata = record.get("metadata")
        if isinstance(metadata, str) and "metadata" in columns and table.schema.equals(SCHEMA):
            record["metadata"] = json.loads(metadata)
        document = _validate(record, path, number, report, json.dumps(record, default=str)[:200])
        if document is not None:
            yield document


def _validate(record: Any, path: str, number: int, report: ReadReport, raw: bytes | str) -> dict[str, Any] | None:
    if not isinstance(record, dict):
        report.reject(path, number, "malformed_json", raw)
        return None
    text = record.get("text")
    if not isinstance(text, str):
        report.reject(path, number, "missing_text", raw)
        return None
    if not text.strip():
        report.reject(path, number, "empty_text", raw)
        return None
    doc_id = record.get("id")
    if doc_id is None:
        report.reject(path, number, "missing_id", raw)
        return None
    report.docs += 1
    report.bytes += len(text.encode("utf-8"))
    source = record.get("source")
    return {"id": str(doc_id), "text": text, "source": None if source is None else str(source),
            "metadata": record.get("metadata")}  # fmt: skip


def to_table(documents: Iterable[dict[str, Any]]) -> pa.Table:
    rows = [
        {
            "id": document["id"],
            "text": document["text"],
            "source": document.get("source"),
            "metadata": None if document.get("metadata") is None else json.dumps(document["metadata"]),
        }
        for document in documents
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def table_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def write_table(writer: ShardWriter, relative: str, table: pa.Table) -> None:
    """Write `table` as zstd Parquet through the shard's writer (committed with the shard)."""
    with writer.open(relative) as handle:
        handle.write(table_bytes(table))


def shard_file(shard_index: int) -> str:
    return f"{DOCS_DIR}/shard-{shard_index:05d}.parquet"


def text_bytes(texts: Iterable[str]) -> int:
    return sum(len(text.encode("utf-8")) for text in texts)


def flow_stats(report: ReadReport, docs_out: int, bytes_out: int) -> dict[str, Any]:
    """The per-shard figures every document step reports (summed over shards by `merge_stats`)."""
    return {
        "rows": docs_out,
        "docs_in": report.docs,
        "bytes_in": report.bytes,
        "tokens_in_estimate": report.bytes // BYTES_PER_TOKEN,
        "docs_out": docs_out,
        "bytes_out": bytes_out,
        "tokens_out_estimate": bytes_out // BYTES_PER_TOKEN,
        "bad_input": dict(report.bad),
        "bad_samples": report.samples,
    }


def merge_stats(report: ShardReport) -> dict[str, Any]:
    """Sum the shards' stats: numbers add up, dicts of numbers add up by key, sample lists concatenate."""
    merged: dict[str, Any] = {"shards": report.total}
    for shard_id in sorted(report.markers):
        for key, value in report.markers[shard_id].get("stats", {}).items():
            if key == "rows":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, dict, list)):
                merged.setdefault(key, value)
            elif isinstance(value, dict):
                bucket = merged.setdefault(key, {})
                for name, count in value.items():
                    bucket[name] = bucket.get(name, 0) + count
            elif isinstance(value, list):
                merged[key] = (merged.get(key, []) + value)[:MAX_SAMPLES]
            else:
                merged[key] = merged.get(key, 0) + value
    return merged


def write_stats(output_path: str, stats: dict[str, Any]) -> None:
    storage.write_json_atomic(storage.join(output_path, "stats.json"), stats)
    logger.info("%s: %s docs in, %s out", output_path, stats.get("docs_in"), stats.get("docs_out"))


def read_shard_table(path: str) -> pa.Table:
    """One of our own Parquet shards, whole (shards are sized to fit a worker's memory)."""
    return pq.read_table(io.BytesIO(_open_bytes(path)))
