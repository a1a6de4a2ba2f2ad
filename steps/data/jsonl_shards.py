"""JSONL.gz shards: how corpus steps write documents and how later steps read them back.

A corpus is a folder holding `shard-00000.jsonl.gz`, `shard-00001.jsonl.gz`, ... with one JSON
record per line (`{"id", "text", "source"}` for text corpora). Each shard is gzipped in memory and
written with one atomic write through `executor.storage`, so a reader never sees half a shard and
the code works on any fsspec store. Gzip's header timestamp is pinned to 0 so that the same
documents always give the same bytes, and so the same checksums in the step's manifest.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import re
from collections.abc import Iterable, Iterator
from typing import Any

from executor import storage
from steps.data.documents import ReadReport, list_input_files, read_documents

logger = logging.getLogger(__name__)

_SHARD_NAME = re.compile(r"^shard-(\d+)\.jsonl\.gz$")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.jsonl.gz"


def write_shards(output_path: str, records: Iterable[dict[str, Any]], records_per_shard: int) -> int:
    """Write `records` as consecutive shards of `records_per_shard` lines; returns the shard count."""
    if records_per_shard < 1:
        raise ValueError(f"records_per_shard must be at least 1, got {records_per_shard}")
    shards = 0
    for batch in itertools.batched(records, records_per_shard):
        lines = "".join(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n" for record in batch)
        path = storage.join(output_path, shard_name(shards))
        storage.write_atomic(path, gzip.compress(lines.encode("utf-8"), mtime=0))
        logger.info("wrote %s (%d records)", path, len(batch))
        shards += 1
    return shards


def list_shards(input_path: str) -> list[str]:
    """Full paths of the shards under `input_path`, in shard order; an error if there are none."""
    numbered = []
    for name in storage.list_names(input_path):
        match = _SHARD_NAME.match(name)
        if match:
            numbered.append((int(match.group(1)), name))
    if not numbered:
        raise FileNotFoundError(
            f"no shard-*.jsonl.gz files under {input_path}; point the step at a text corpus output "
            "(the step that wrote it may not have finished)"
        )
    return [storage.join(input_path, name) for _index, name in sorted(numbered)]


def read_records(input_path: str, report: ReadReport | None = None) -> Iterator[dict[str, Any]]:
    """Every document (`id`, `text`, `source`, `metadata`) under `input_path`, in order, through the one document
    reader (`steps/data/documents.py`): bad lines are counted in `report`, not raised. A text corpus's shards are read
    in shard order; any other folder (a data step's `docs/`) by its document files (JSONL or Parquet)."""
    report = report if report is not None else ReadReport()
    try:
        paths = list_shards(input_path)
    except FileNotFoundError:
        paths = list_input_files(input_path)
    for path in paths:
        yield from read_documents(path, report, raw=False)


def read_texts(input_paths: Iterable[str]) -> Iterator[str]:
    """The `text` field of every record of every input, in order."""
    for input_path in input_paths:
        for record in read_records(input_path):
            yield record["text"]
