"""A step's metrics lines on the published site: append-only chunks, folded now and then into sealed segments.

    data/step/<R>/metrics/index.json         where the lines are (a fixed size, rewritten when lines arrive)
    data/step/<R>/metrics/s<E>-00000.jsonl   sealed segments 0 .. segments-1 of epoch E, never rewritten
    data/step/<R>/metrics/c<E>-00000042.jsonl  the open chunks first .. next-1: one per cycle that saw new lines

A cycle that finds K new complete lines in the step's metrics.jsonl writes them, redacted, as one new chunk and
rewrites the index: it costs the new lines plus a constant, however long the run has been going. The pages do
not read these lines (they draw run.json and metrics.json, made by the dashboard's own watch/training/run_view.py and
metrics_view.py); they are the run's figures, whole, for anyone to download and check. So that a reader never has
thousands of chunks to fetch, a cycle whose new lines would bring the open chunks to `segment_bytes` or to
`max_chunks` folds them, its new lines with them, into the next sealed segment (written once) and deletes them:
such a cycle writes up to a segment, but in all each line is written at most twice (once when a cycle's lines
fill a segment by themselves, as a first cycle's do), and a page's first load fetches about
(run bytes / segment_bytes) + max_chunks files, each poll after that the index and a chunk.

Everything a watcher needs to go on is in the published index (byte offsets into the step's metrics stream),
so a restarted watcher continues where the last one stopped. A metrics stream shorter than what was published
(the step rerun with --force_run) begins a new epoch E: its lines are published again from the start, under
new names, the old epoch's files are deleted, and the page drops what it had. So does a stream whose published
lines hold a name the redactor learned after they went out (`recheck`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from executor.store import storage
from executor.store.layout import METRICS_FILE
from executor.store.metrics_log import read_metrics_bytes
from executor.watch.site.files import SiteWriter
from executor.watch.site.redaction import Redactor

logger = logging.getLogger(__name__)

SEGMENT_BYTES = 1 << 20
MAX_CHUNKS = 64
INDEX = "index.json"
REWRITTEN = b"(rewritten)"


@dataclass
class MetricsIndex:
    """What `metrics/index.json` says: the published files and how far into the source they reach."""

    epoch: int = 0
    segments: int = 0
    """Sealed segments s<epoch>-00000 .. s<epoch>-<segments-1>."""
    first_chunk: int = 0
    next_chunk: int = 0
    """Open chunks c<epoch>-<first_chunk> .. c<epoch>-<next_chunk - 1>."""
    lines: int = 0
    bytes: int = 0
    """Lines and bytes published (redacted), sealed and open."""
    source_bytes: int = 0
    """How far into the step's metrics stream the published lines reach."""
    sealed_source_bytes: int = 0
    """Where in the stream the open chunks begin (what the next seal re-reads)."""
    open_bytes: int = 0
    """Bytes in the open chunks."""

    @classmethod
    def from_json(cls, document: Any) -> MetricsIndex | None:
        """The index a site holds (None for none, or one of an older layout: that run is published anew)."""
        if not isinstance(document, dict) or "sealed_source_bytes" not in document:
            return None
        fields = cls.__dataclass_fields__
        return cls(**{key: int(value) for key, value in document.items() if key in fields})

    def segment_name(self, number: int) -> str:
        return f"s{self.epoch}-{number:05d}.jsonl"

    def chunk_name(self, number: int) -> str:
        return f"c{self.epoch}-{number:08d}.jsonl"


def _records(data: bytes) -> list[dict[str, Any]]:
    records = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def redact_lines(data: bytes, redactor: Redactor) -> tuple[bytes, int]:
    """Metrics lines in their public form, and how many (a line that is not a JSON object is left out)."""
    records = _records(data)
    return b"".join(json.dumps(redactor.value(record)).encode() + b"\n" for record in records), len(records)


class MetricsPublisher:
    """Publishes the metrics lines of each step it is given (module docstring); one index per step, kept here."""

    def __init__(
        self, site: SiteWriter, redactor: Redactor, segment_bytes: int = SEGMENT_BYTES, max_chunks: int = MAX_CHUNKS
    ):
        self.site = site
        self.redactor = redactor
        self.segment_bytes = segment_bytes
        self.max_chunks = max_chunks
        self._indexes: dict[str, MetricsIndex] = {}
        self._anew: set[str] = set()
        """Folders whose published lines hold a name learned since (`recheck`): published anew on their next turn."""

    def recheck(self, names: set[str]) -> set[str]:
        """Names were learned after some lines were published, by this publisher or an earlier one on the same
        site: a step whose published lines (the site's own bytes) hold one of them is published anew (a new
        epoch, every line redacted again) the next time it is published; returns those."""
        needles = [name.encode() for name in names if name]
        found = {folder for folder, index in self._indexes.items()
                 if any(needle in self._published(folder, index) for needle in needles)}  # fmt: skip
        self._anew |= found
        return found

    def track(self, folder: str) -> None:
        """Know what the site holds of the step's lines (its index), so `recheck` looks at them, publishing nothing."""
        if folder not in self._indexes:
            index = MetricsIndex.from_json(self.site.read_json(f"{folder}/metrics/{INDEX}"))
            if index is not None:
                self._indexes[folder] = index

    def _published(self, folder: str, index: MetricsIndex) -> bytes:
        """Every byte of the step's lines the site holds: its sealed segments and open chunks."""
        names = [index.segment_name(number) for number in range(index.segments)]
        names += [index.chunk_name(number) for number in range(index.first_chunk, index.next_chunk)]
        blobs = storage.read_many(storage.join(self.site.destination, f"{folder}/metrics/{name}") for name in names)
        return b"".join(blob or b"" for blob in blobs)

    def publish(self, output_path: str, folder: str) -> None:
        """Publish the step's new complete lines under `<folder>/metrics/` (nothing while it has no metrics)."""
        index = self._indexes.get(folder) or MetricsIndex.from_json(self.site.read_json(f"{folder}/metrics/{INDEX}"))
        index = index or MetricsIndex()
        source = storage.join(output_path, METRICS_FILE)
        data = self._read(source, index)
        if data is None:
            return
        stale: list[str] = []
        if data is REWRITTEN or folder in self._anew:
            self._anew.discard(folder)
            logger.info("%s is not the stream that was published (a rerun, or a name to hide): publishing it anew",
                        source)  # fmt: skip
            stale = [index.segment_name(number) for number in range(index.segments)]
            stale += [index.chunk_name(number) for number in range(index.first_chunk, index.next_chunk)]
            index = MetricsIndex(epoch=index.epoch + 1)
            data = read_metrics_bytes(source) or b""
        fresh = data[index.source_bytes - index.sealed_source_bytes :]
        fresh = fresh[: fresh.rfind(b"\n") + 1]  # a line still being written waits for the next cycle
        if fresh:
            public, lines = redact_lines(fresh, self.redactor)
            index.source_bytes += len(fresh)
            index.lines += lines
            index.bytes += len(public)
            full = index.open_bytes + len(public) >= self.segment_bytes
            if full or index.next_chunk - index.first_chunk + 1 >= self.max_chunks:  # fold, the new lines with them
                self._seal(index, folder, data[: index.source_bytes - index.sealed_source_bytes])
            else:
                self.site.write_once(f"{folder}/metrics/{index.chunk_name(index.next_chunk)}", public)
                index.next_chunk += 1
                index.open_bytes += len(public)
        self._write_index(index, folder)
        self._indexes[folder] = index
        for name in stale:  # after the new index, so a page never reads a name that is gone
            self.site.remove(f"{folder}/metrics/{name}")

    def _write_index(self, index: MetricsIndex, folder: str) -> None:
        self.site.write_json(f"{folder}/metrics/{INDEX}", asdict(index))

    @staticmethod
    def _read(source: str, index: MetricsIndex) -> bytes | None:
        """The stream from where the open chunks begin; REWRITTEN when it no longer holds what was published
        there: it is shorter, or the published part's last newline (read along, one byte early) is gone."""
        start = max(0, index.sealed_source_bytes - 1)
        data = read_metrics_bytes(source, start=start)
        if data is None:
            return None
        if index.sealed_source_bytes:
            if data[:1] != b"\n":
                return REWRITTEN
            data = data[1:]
        return REWRITTEN if index.sealed_source_bytes + len(data) < index.source_bytes else data

    def _seal(self, index: MetricsIndex, folder: str, open_source: bytes) -> None:
        """Fold the open chunks and the new lines (the stream's bytes `open_source`) into the next sealed segment."""
        public, _ = redact_lines(open_source, self.redactor)
        self.site.write_once(f"{folder}/metrics/{index.segment_name(index.segments)}", public)
        chunks = range(index.first_chunk, index.next_chunk)
        index.segments += 1
        index.first_chunk = index.next_chunk
        index.sealed_source_bytes = index.source_bytes
        index.open_bytes = 0
        self._write_index(index, folder)  # first, so a page reading the index finds the segment, never a chunk gone
        for number in chunks:
            self.site.remove(f"{folder}/metrics/{index.chunk_name(number)}")
