"""A step's `metrics.jsonl` on any store, written live and read as one stream of lines.

    log = MetricsLog("gs://bucket/train-abc/metrics.jsonl")
    log.write(json.dumps({"step": 1, "train/loss": 9.1}))   # seen by readers within `flush_seconds`
    log.close()
    read_metrics_bytes("gs://bucket/train-abc/metrics.jsonl")  # b'{"step": 1, ...}\\n'

On a local disk the lines are appended to the file and flushed one by one. Object stores have no append,
and a buffered upload shows nothing until it is closed, so there the lines go to numbered segments beside
it, `metrics.jsonl.d/00000000.jsonl`, ...: the open segment is rewritten whole (one atomic put) at most
every `flush_seconds`, and a new one is begun once it holds `segment_bytes`, so a flush costs at most one
segment however long the run, and a run of weeks leaves a few hundred objects. A restarted writer (a
resumed run) begins after the last segment and never rewrites one another process wrote. A kill loses
at most the last `flush_seconds` of lines.

Readers (the train step's `read_metrics`, the dashboard) take the file's lines, then the segments' in order.

JSON has no NaN or infinity, and a metric that is NaN is the one a viewer most needs to see, so a value that
is not finite is recorded as the JSON string `"NaN"`, `"Infinity"` or `"-Infinity"` (`metric_json`: what
JavaScript's `String()` gives, so any JSON parser reads the line), never as `null`, which means "not logged".
Every reader takes a value through `metric_number`, which reads those strings back as the float they were (and
the published "nan", "inf", "-inf" too; a bare `NaN` token, which Python's json writes and reads, is a float).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from executor.store import storage

NONFINITE_JSON = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How a metrics line records a value that is not finite (module docstring)."""
NONFINITE_READ = {**NONFINITE_JSON, "nan": math.nan, "inf": math.inf, "-inf": -math.inf}
"""What readers take as a non-finite number: the recorded strings and the published ones (watch/series.py)."""
SEGMENTS_SUFFIX = ".d"
SEGMENT_BYTES = 1 << 20
FLUSH_SECONDS = 10.0


def segments_folder(path: str) -> str:
    return path + SEGMENTS_SUFFIX


class MetricsLog:
    """Writes the lines of the metrics file at `path` (module docstring)."""

    def __init__(self, path: str, flush_seconds: float = FLUSH_SECONDS, segment_bytes: int = SEGMENT_BYTES):
        self.path = path
        self._flush_seconds = flush_seconds
        self._segment_bytes = segment_bytes
        self._local = storage.on_local_disk(path)
        if self._local:
            storage.makedirs(storage.dirname(path))
            fs, fs_path = storage.filesystem(path)
            self._file = fs.open(fs_path, "a")
            return
        existing = [int(name.split(".")[0]) for name in storage.list_names(segments_folder(path))
                    if name.endswith(".jsonl") and name.split(".")[0].isdigit()]  # fmt: skip
        self._segment = max(existing, default=-1) + 1
        self._held: list[str] = []  # the open segment's lines
        self._held_bytes = 0
        self._unsaved = False
        self._saved_at = time.monotonic()

    def write(self, line: str) -> None:
        """Add one line (without its newline)."""
        if self._local:
            self._file.write(line + "\n")
            self._file.flush()
            return
        self._held.append(line + "\n")
        self._held_bytes += len(line) + 1
        self._unsaved = True
        if time.monotonic() - self._saved_at >= self._flush_seconds or self._held_bytes >= self._segment_bytes:
            self.flush()

    def flush(self) -> None:
        """Make every line written so far visible to readers."""
        if self._local or not self._unsaved:
            return
        name = storage.join(segments_folder(self.path), f"{self._segment:08d}.jsonl")
        storage.write_atomic(name, "".join(self._held))
        self._unsaved, self._saved_at = False, time.monotonic()
        if self._held_bytes >= self._segment_bytes:
            self._segment, self._held, self._held_bytes = self._segment + 1, [], 0

    def close(self) -> None:
        if self._local:
            self._file.close()
        else:
            self.flush()


def read_metrics_bytes(path: str, limit: int | None = None, start: int = 0) -> bytes | None:
    """The file's bytes, then its segments' in order, from byte `start` of that stream, up to `limit` bytes;
    None if there is neither. Segments wholly before `start` are skipped by their listed size, unread."""
    fs, fs_path = storage.filesystem(path)
    chunks: list[bytes] = []
    skip = start
    try:
        with fs.open(fs_path, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(min(skip, size))
            chunks.append(handle.read() if limit is None else handle.read(limit))
            skip -= min(skip, size)
    except FileNotFoundError:
        pass
    folder = segments_folder(path)
    segments = [entry for entry in storage.list_details(folder) if entry["name"].endswith(".jsonl")]
    if not chunks and not segments:
        return None
    held = sum(map(len, chunks))
    for entry in segments:
        if limit is not None and held >= limit:
            break
        size = int(entry.get("size") or 0)
        if skip and skip >= size:
            skip -= size
            continue
        data = (storage.read_bytes(storage.join(folder, entry["name"])) or b"")[skip:]
        skip = 0
        chunks.append(data if limit is None else data[: limit - held])
        held += len(chunks[-1])
    return b"".join(chunks)


def read_metrics_tail(path: str, tail_bytes: int) -> bytes | None:
    """The last `tail_bytes` of the file's stream (the file, then its segments), from the start of the first whole
    line in them; None if there is no stream. A view that needs a run's newest lines reads this, not the whole
    stream, however long the run."""
    fs, fs_path = storage.filesystem(path)
    try:
        size = int(fs.size(fs_path))
    except FileNotFoundError:
        size = 0
    size += sum(int(entry.get("size") or 0) for entry in storage.list_details(segments_folder(path))
                if entry["name"].endswith(".jsonl"))  # fmt: skip
    start = max(0, size - tail_bytes)
    if start == 0:
        return read_metrics_bytes(path)
    data = read_metrics_bytes(path, start=start - 1)  # from the byte before: a line that begins at `start` is whole
    if data is None:
        return None
    cut = data.find(b"\n")  # everything up to the first line end is part of a line that began before the tail
    return b"" if cut < 0 else data[cut + 1 :]


def rows_by_step(records: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """One row per step: the lines of a step merged in file order, so a resumed run's later line wins."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records:
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            rows.setdefault(step, {}).update(record)
    return rows


def metric_json(value: float) -> float | str:
    """A float as a metrics line records it: itself when finite, else "NaN", "Infinity" or "-Infinity"."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def metric_number(value: Any) -> float | None:
    """A recorded metric value as a number, NaN and infinities included (module docstring); None for anything
    else (null, text, a list, a bool)."""
    kind = type(value)
    if kind is float or kind is int:
        return float(value)
    if kind is str:
        return NONFINITE_READ.get(value)
    return None
