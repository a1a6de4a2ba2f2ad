"""The document format every data step reads and writes, and the bookkeeping of bad input.

Input: JSONL (plain, `.gz`, `.zst`) or Parquet, at any fsspec URL: a file, a folder (searched
recursively) or a glob. Each document has a string `id` and `text`, and optionally `source` and
`metadata` (any JSON value). Output: `docs/shard-00000.parquet`, ... (zstd) with the stable
schema `SCHEMA`; `metadata` is stored as JSON text so the schema never depends on the data.

Bad input is counted, sampled and reported, never silently passed on or dropped: a line that is
not valid UTF-8 (`invalid_utf8`), not a JSON object (`malformed_json`), nested too deeply for the
parser (`json_too_deep`), without a string `text` (`missing_text`) or `id` (`missing_id`), whose
text is only whitespace (`empty_text`), or whose strings hold half of a UTF-16 surrogate pair,
which JSON can spell (`"\ud800"`) but no UTF-8 writer accepts (`lone_surrogate`). A `.gz`/`.zst`
file that ends early (`truncated_file`) or turns to garbage (`corrupt_file`) keeps every complete
line before that point. `ReadReport` keeps the counts and the first few samples (file, line,
reason, excerpt), which end up in the step's stats.json. A raw input file whose lines are all bad,
or which has no line at all, is an error naming it. Compressed files are decompressed in chunks
and split into lines as they go, so a file's text is never whole in memory twice.

This is the one reader of documents: `steps/data/jsonl_shards.read_records` (corpus stats, tokenizer
training) goes through it too.

Documents are ordered by (input file in sorted order, line): `doc_key(shard, row)` packs that
order into one int64, so "keep the first occurrence" means "keep the smallest key" everywhere.
"""

from __future__ import annotations

import builtins
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from isal import isal_zlib

from executor import Shard, ShardReport, ShardWriter, storage

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
_CHUNK = 1 << 18
"""Compressed input is decompressed this many bytes at a time, so a file's text is never whole in memory."""
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
    source: str | None = None
    """The source the file belongs to, for steps over many sources that write `docs/<source>/`."""


def file_shards[ConfigT](config: ConfigT, files: Sequence[str], sources: Sequence[str | None] = ()) -> list[Shard]:
    """One shard per input file, named by its position (so a restart finds the same shard ids); `sources`
    gives each file's source where a step keeps sources apart."""
    named = list(sources) or [None] * len(files)
    return [Shard(f"{index:05d}", FileShard(config, index, path, source))
            for index, (path, source) in enumerate(zip(files, named, strict=True))]  # fmt: skip


def list_source_files(input_paths: Sequence[str], input_sources: Sequence[str] | None, step: str
                      ) -> tuple[list[str], list[str | None]]:  # fmt: skip
    """`list_input_files` with each file's source: `input_sources[i]` names the files under `input_paths[i]`;
    `step` names the step in errors."""
    if input_sources is None:
        unnamed = list_input_files(input_paths)
        return unnamed, [None] * len(unnamed)
    if len(input_sources) != len(input_paths) or len(set(input_sources)) != len(input_sources):
        raise ValueError(f"{step}: input_sources must name each of the {len(input_paths)} input paths once, got "
                         f"{list(input_sources)}; give one distinct source name per input path")  # fmt: skip
    files: list[str] = []
    sources: list[str | None] = []
    for input_path, source in zip(input_paths, input_sources, strict=True):
        found = list_input_files(input_path)
        files += found
        sources += [source] * len(found)
    return files, sources


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


MEAN_DOC_BYTES_FLOOR = 500
"""Partition counts are sized assuming documents average at least this much text. Web text averages
2-4 KB and source files more, so this over-provisions partitions a few times: more, smaller files,
never a shard over its memory budget."""
_EXPANSION = {".gz": 4, ".zst": 4, ".parquet": 3}
"""How much text a byte of each compressed format holds, roughly (zstd/gzip on text: 3-5x)."""


def estimated_documents(files: Sequence[str]) -> int:
    """An upper estimate of the documents in `files`, from their sizes alone (read before any shard runs)."""
    if not files:
        return 0
    fs, _ = storage.filesystem(files[0])
    sizes = fs.sizes(list(files))
    text_bytes = sum(int(size or 0) * _EXPANSION.get("." + path.rsplit(".", 1)[-1], 1)
                     for path, size in zip(files, sizes, strict=True))  # fmt: skip
    return max(1, text_bytes // MEAN_DOC_BYTES_FLOOR)


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


def _raw_bytes(path: str) -> bytes:
    data = storage.read_bytes(path)
    if data is None:
        raise FileNotFoundError(f"input file {path} is gone (listed, then missing)")
    return data


class _DamagedArchiveError(Exception):
    """A compressed file that ends early (`truncated_file`) or holds garbage (`corrupt_file`)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def _stream_frames(data: bytes, new_frame: Callable[[], Any], errors: tuple[type[Exception], ...]) -> Iterator[bytes]:
    """Decompressed chunks of concatenated frames (gzip members, zstd frames), fed `_CHUNK` bytes at a time;
    everything readable comes out before a cut or damaged frame raises `_DamagedArchiveError`."""
    view, start = memoryview(data), 0
    try:
        while start < len(view):
            frame, position = new_frame(), start
            while not frame.eof and position < len(view):
                yield frame.decompress(view[position : position + _CHUNK])
                position = min(position + _CHUNK, len(view))
            if not frame.eof:
                raise _DamagedArchiveError("truncated_file", "the compressed stream ends inside a frame")
            start = position - len(frame.unused_data)
    except errors as error:
        raise _DamagedArchiveError("corrupt_file", str(error)) from error


_GZIP_ERRORS: tuple[type[Exception], ...] = (isal_zlib.error,)  # type: ignore[assignment]
"""ISA-L's gzip (python-isal: zlib's interface, about 3x its speed here); its stub types its error class as an
instance."""


def _decompressed_chunks(path: str) -> Iterator[bytes]:
    data = _raw_bytes(path)
    if path.endswith(".gz"):
        return _stream_frames(data, lambda: isal_zlib.decompressobj(wbits=31), _GZIP_ERRORS)
    if path.endswith(".zst"):
        return _stream_frames(data, zstandard.ZstdDecompressor().decompressobj, (zstandard.ZstdError,))
    return iter([data])


def _numbered_lines(path: str, report: ReadReport) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSONL file, streamed; a damaged archive keeps its complete lines."""
    pending, number = b"", 0
    try:
        for chunk in _decompressed_chunks(path):
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                number += 1
                yield number, line
    except _DamagedArchiveError as error:
        # The last, unterminated line is where the archive was cut: not a document.
        report.reject(path, number + 1, error.reason, f"{error} (after {number} complete lines)")
        return
    if pending:
        yield number + 1, pending


_JSON = msgspec.json.Decoder()
"""Parses a JSONL line twice as fast as `json.loads` (bench_tokenize's files: 6 ms against 12, with no UTF-8
decode first) and to the same values (big integers included); see `_parse`."""


def _parse(line: bytes) -> tuple[Any, str | None]:
    """(the line's JSON value, None), or (None, why it is bad). msgspec first; a line it refuses goes to
    `json.loads`, which takes all that the standard library takes (NaN, 1e400, half a surrogate pair, which
    `_validate` then rejects) and tells the reasons apart."""
    try:
        return _JSON.decode(line), None
    except (ValueError, RecursionError):  # msgspec.DecodeError is a ValueError
        pass
    try:
        return json.loads(line.decode("utf-8")), None
    except UnicodeDecodeError:
        return None, "invalid_utf8"
    except RecursionError:
        return None, "json_too_deep"
    except ValueError:
        return None, "malformed_json"


def _read_jsonl(path: str, report: ReadReport) -> Iterator[dict[str, Any]]:
    for number, line in _numbered_lines(path, report):
        if not line.strip():
            continue
        record, bad = _parse(line)
        if bad is not None:
            report.reject(path, number, bad, line)
            continue
        document = _validate(record, path, number, report, line)
        if document is not None:
            yield document


def _read_parquet(path: str, report: ReadReport) -> Iterator[dict[str, Any]]:
    table = _parquet_table(path)
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
    source = None if record.get("source") is None else str(record["source"])
    try:
        # JSON may spell half of a surrogate pair ("\\ud800"): a str that no UTF-8 writer accepts.
        text_size = len(text.encode("utf-8"))
        for value in (str(doc_id), source or ""):
            value.encode("utf-8")
    except UnicodeEncodeError:
        report.reject(path, number, "lone_surrogate", raw)
        return None
    report.docs += 1
    report.bytes += text_size
    return {"id": str(doc_id), "text": text, "source": source, "metadata": record.get("metadata")}


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


def shard_file(shard_index: int, source: str | None = None) -> str:
    """Where a step writes the kept documents of input file `shard_index` (under `docs/<source>/` by source)."""
    folder = f"{DOCS_DIR}/{source}" if source is not None else DOCS_DIR
    return f"{folder}/shard-{shard_index:05d}.parquet"


def source_stats(source: str | None, docs_in: int, docs_out: int) -> dict[str, dict[str, int]]:
    """A shard's figures by source, which `merge_stats` sums by key across shards ({} for a step without sources)."""
    if source is None:
        return {}
    return {"docs_in_by_source": {source: docs_in}, "docs_out_by_source": {source: docs_out}}


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
    return _parquet_table(path)


def _parquet_table(path: str) -> pa.Table:
    """A whole Parquet file; BadInputError naming it if it is cut short or is not Parquet (pyarrow's own error
    names only '<Buffer>')."""
    try:
        return pq.read_table(io.BytesIO(_raw_bytes(path)))
    except (pa.ArrowInvalid, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise BadInputError(
            f"input file {path} is not a readable Parquet file ({' '.join(str(error).split())}): it is cut short or "
            "damaged; download it again, or rerun the step that wrote it (--force_run)"
        ) from error
