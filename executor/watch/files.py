"""A step's files, read for people: a folder listing, previews of JSONL / JSON / Parquet / text,
the tail of the step log, and the lines of metrics.jsonl (drawn by metrics_view.py and training/run_view.py).

Every read is bounded (a preview reads the first rows or bytes, a log the last 64 KiB, a metrics
file at most `MAX_METRICS_BYTES` from its start or `METRICS_TAIL_BYTES` from its end), so a 50 GB shard or a year of
metrics never stalls the server.
Compressed files (`.gz`, `.zst`, ...) are opened through fsspec's compression inference.
"""

from __future__ import annotations

import json
import math
import posixpath
from typing import Any

from executor.store import storage
from executor.store.layout import is_metadata
from executor.store.metrics_log import read_metrics_bytes, read_metrics_tail

PREVIEW_ROWS = 50
PREVIEW_BYTES = 256 * 1024
LOG_TAIL_BYTES = 64 * 1024
MAX_LISTING = 2000
MAX_METRICS_BYTES = 32 * 1024 * 1024
METRICS_TAIL_BYTES = 1024 * 1024
"""What a view that needs only a run's newest lines reads of its metrics (`metrics_tail_records`): some 2,500
lines, hundreds of steps."""


def list_folder(full_path: str) -> dict[str, Any]:
    """Entries directly under `full_path` with sizes: outputs before executor files, folders before files."""
    fs, fs_path = storage.filesystem(full_path)
    try:
        entries = fs.ls(fs_path, detail=True, refresh=True)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"no folder at {full_path}") from error
    items = [
        {
            "name": posixpath.basename(entry["name"].rstrip("/")),
            "type": "dir" if entry.get("type") == "directory" else "file",
            "size": int(entry.get("size") or 0),
        }
        for entry in entries
        if entry["name"].rstrip("/") != fs_path.rstrip("/")
    ]
    # The step's own outputs first; the executor's files (.executor_*, logs/) after them.
    items.sort(key=lambda item: (is_metadata(item["name"]), item["type"] != "dir", item["name"]))
    return {"entries": items[:MAX_LISTING], "truncated": len(items) > MAX_LISTING, "count": len(items)}


def _kind(name: str) -> str:
    stem = name
    for suffix in (".gz", ".zst", ".bz2", ".xz", ".lz4"):
        stem = stem.removesuffix(suffix)
    if stem.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if stem.endswith(".parquet"):
        return "parquet"
    if stem.endswith(".json") or (name.startswith(".executor_") and name != ".executor_status"):
        return "json"
    if name == ".executor_status":
        return "jsonl"
    return "text"


def preview(full_path: str) -> dict[str, Any]:
    """The first rows (JSONL, Parquet), the parsed document (small JSON) or the first bytes (text)."""
    fs, fs_path = storage.filesystem(full_path)
    info = fs.info(fs_path)
    if info.get("type") == "directory":
        raise IsADirectoryError(f"{full_path} is a folder")
    size = int(info.get("size") or 0)
    kind = _kind(posixpath.basename(fs_path))
    result: dict[str, Any] = {"kind": kind, "size": size}
    if kind == "parquet":
        return result | _parquet_rows(fs, fs_path)
    with fs.open(fs_path, "rb", compression="infer") as handle:
        head = handle.read(PREVIEW_BYTES + 1)
    truncated = len(head) > PREVIEW_BYTES
    head = head[:PREVIEW_BYTES]
    if b"\x00" in head[:8192]:
        return result | {"kind": "binary", "truncated": truncated}
    text = head.decode("utf-8", errors="replace")
    if kind == "jsonl":
        lines = text.splitlines()
        if truncated and lines:
            lines = lines[:-1]  # the last line may be cut
        rows = [_parse_line(line) for line in lines[:PREVIEW_ROWS] if line.strip()]
        return result | {"rows": rows, "truncated": truncated or len(lines) > PREVIEW_ROWS}
    if kind == "json" and not truncated:
        try:
            return result | {"document": json.loads(text), "truncated": False}
        except ValueError:
            pass
    return result | {"kind": "text", "text": text, "truncated": truncated}


def _parse_line(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return line


def _parquet_rows(fs: Any, fs_path: str) -> dict[str, Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return {"rows": [], "note": "install pyarrow on the dashboard's machine to preview Parquet rows"}
    with fs.open(fs_path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        batch = next(parquet.iter_batches(batch_size=PREVIEW_ROWS), None)
        rows = batch.to_pylist() if batch is not None else []
        total = parquet.metadata.num_rows
        schema = [f"{field.name}: {field.type}" for field in parquet.schema_arrow]
    return {
        "rows": json.loads(json.dumps(rows, default=str)),
        "truncated": total > len(rows),
        "total_rows": total,
        "schema": schema,
    }


def log_tail(full_path: str, tail_bytes: int = LOG_TAIL_BYTES) -> dict[str, Any]:
    """The last `tail_bytes` of a log, starting at a line boundary."""
    fs, fs_path = storage.filesystem(full_path)
    try:
        size = int(fs.info(fs_path).get("size") or 0)
    except FileNotFoundError:
        return {"text": "", "size": 0, "exists": False}
    start = max(0, size - tail_bytes)
    with fs.open(fs_path, "rb") as handle:
        handle.seek(start)
        data = handle.read(size - start)
    text = data.decode("utf-8", errors="replace")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]
    return {"text": text, "size": size, "exists": True, "truncated": start > 0}


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metrics_tail_records(full_path: str, tail_bytes: int = METRICS_TAIL_BYTES) -> list[dict[str, Any]] | None:
    """The JSON object lines in the last `tail_bytes` of a metrics.jsonl, whole lines only (None if there is no
    file): a run's newest lines however long it has run, where `metrics_records` holds its first."""
    data = read_metrics_tail(full_path, tail_bytes)
    if data is None:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    return [record for record in map(_parse_line, lines) if isinstance(record, dict)]


def metrics_records(full_path: str) -> list[dict[str, Any]] | None:
    """The JSON object lines of a metrics.jsonl (its first MAX_METRICS_BYTES), or None if there is no file."""
    data = read_metrics_bytes(full_path, MAX_METRICS_BYTES)  # the file, or an object store's segments of it
    if data is None:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    if len(data) == MAX_METRICS_BYTES:
        lines = lines[:-1]  # cut mid-line by the read limit
    return [record for record in map(_parse_line, lines) if isinstance(record, dict)]
