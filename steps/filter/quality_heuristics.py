"""Heuristic quality filters: datatrove's Gopher, C4 and FineWeb filters, used as blocks.

They are battle-tested on web text, so we call them as they are (`filter(Document)` per document)
rather than rewrite them. What we add is where they fall short for a multi-domain corpus:

- `skip_sources`: the filters are tuned for English web prose; on code (few stop words, many
  symbols, short lines without terminal punctuation) Gopher and C4 drop almost everything, so
  sources matching these globs pass through untouched and are counted as `skipped_source`.
- per-filter, per-reason drop counts and a sample of dropped ids in stats.json, so a threshold's
  effect is visible without rerunning anything.

A document is dropped by the first filter that rejects it; `C4QualityFilter` may also remove
lines (its line-level rules), in which case the shortened text is what is written.

Output: `docs/shard-*.parquet`, `stats.json`.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

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

logger = logging.getLogger(__name__)

FILTERS = ("gopher_quality", "gopher_repetition", "c4", "fineweb")


@dataclass(frozen=True)
class QualityHeuristicsConfig:
    input_paths: list[str]
    """Document files, folders or globs (JSONL or Parquet)."""
    output_path: str
    """Where docs/ and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    filters: list[str] = field(default_factory=lambda: list(FILTERS))
    """Which of gopher_quality, gopher_repetition, c4, fineweb to apply, in order. Versioned."""
    skip_sources: list[str] = field(default_factory=list)
    """Globs on `source`: documents from matching sources pass unfiltered (e.g. "code_*"). Versioned."""
    raw_input: bool = False
    """Whether an input file with no usable document is an error (True for raw downloads)."""


def build_filters(names: list[str]) -> list[tuple[str, Any]]:
    """datatrove filter objects by name (imported here: datatrove is only needed by this step)."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    makers = {
        "gopher_quality": GopherQualityFilter,
        "gopher_repetition": GopherRepetitionFilter,
        # Terminal punctuation per line drops every list, table and heading; FineWeb's own ablations
        # found C4's line filter costly, so we keep the other C4 rules only.
        "c4": lambda: C4QualityFilter(filter_no_terminal_punct=False),
        "fineweb": FineWebQualityFilter,
    }
    unknown = [name for name in names if name not in makers]
    if unknown:
        raise ValueError(f"unknown filter(s) {unknown}; choose from {', '.join(FILTERS)}")
    return [(name, makers[name]()) for name in names]


def _filter_shard(payload: FileShard[QualityHeuristicsConfig], writer: ShardWriter) -> dict[str, Any]:
    from datatrove.data import Document

    config = payload.config
    filters = build_filters(config.filters)
    report = ReadReport()
    kept, dropped, samples = [], Counter[str](), list[dict[str, str]]()
    for document in read_documents(payload.path, report, config.raw_input):
        source = document.get("source") or ""
        if any(fnmatch.fnmatch(source, pattern) for pattern in config.skip_sources):
            kept.append(document)
            continue
        candidate = Document(text=document["text"], id=document["id"], metadata={})
        reason = None
        for name, block in filters:
            verdict = block.filter(candidate)
            passed, why = (verdict, None) if isinstance(verdict, bool) else (verdict[0], verdict[1])
            if not passed:
                reason = f"{name}:{why or 'rejected'}"
                break
        if reason is None:
            kept.append({**document, "text": candidate.text})
        else:
            dropped[reason] += 1
            if len(samples) < 5:
                samples.append({"id": document["id"], "reason": reason})
    write_table(writer, shard_file(payload.shard_index), to_table(kept))
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = dict(dropped)
    stats["dropped_samples"] = samples
    stats["skipped_source_docs"] = sum(
        1 for document in kept if any(fnmatch.fnmatch(document.get("source") or "", p) for p in config.skip_sources)
    )
    return stats


def quality_heuristics(config: QualityHeuristicsConfig) -> None:
    build_filters(config.filters)
    files = list_input_files(config.input_paths)
    shards = file_shards(config, files)
    report = run_sharded(config.output_path, shards, _filter_shard, description="quality heuristics")
    stats = merge_stats(report)
    stats["filters"] = list(config.filters)
    write_stats(config.output_path, stats)
