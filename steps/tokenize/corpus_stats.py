"""Describe several text corpora side by side: docs, bytes, whitespace tokens, common words.

Given a tokenizer (a `train_tokenizer` output), it also reports each corpus's tokens per byte,
which shows how well one shared vocabulary fits text of different kinds (code against prose).

Bad lines are skipped by the shared document reader and reported per input (`bad_input`, `bad_samples`).

Output: `stats.json` with one entry per input under "inputs" and the totals at the top level.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from executor import storage
from steps.data.documents import ReadReport
from steps.data.jsonl_shards import read_records
from steps.tokenize.train_tokenizer import load_tokenizer, measure

logger = logging.getLogger(__name__)

_WORD = re.compile(r"[^\W\d_]+")
"""Runs of letters (any script): `self.max_docs = 3` gives "self", "max", "docs"."""


@dataclass(frozen=True)
class CorpusStatsConfig:
    input_paths: list[str]
    """Text corpus outputs (folders of shard-*.jsonl.gz) to describe."""
    output_path: str
    """Where stats.json goes (THIS_OUTPUT_PATH in a DAG)."""
    tokenizer_path: str | None = None
    """A train_tokenizer output; when given, each corpus's tokens per byte is reported too."""
    top_words: int = 20
    """How many of the most common (lower-cased) words to list per input and in total."""
    encode_batch_size: int = 64
    """Documents per `encode_batch` call when counting tokens; memory only."""


def compute_corpus_stats(config: CorpusStatsConfig) -> None:
    if not config.input_paths:
        raise ValueError("input_paths is empty; give at least one text corpus output")
    tokenizer = load_tokenizer(config.tokenizer_path) if config.tokenizer_path else None
    inputs = []
    total_words: Counter[str] = Counter()
    for input_path in config.input_paths:
        described, words = _describe(input_path, tokenizer, config)
        inputs.append(described)
        total_words.update(words)
    stats: dict[str, Any] = {
        "docs": sum(described["docs"] for described in inputs),
        "bytes": sum(described["bytes"] for described in inputs),
        "whitespace_tokens": sum(described["whitespace_tokens"] for described in inputs),
    }
    if tokenizer is not None:
        stats["tokenizer_path"] = config.tokenizer_path
        stats["tokens"] = sum(described["tokens"] for described in inputs)
        stats["tokens_per_byte"] = stats["tokens"] / stats["bytes"] if stats["bytes"] else 0.0
    stats["top_words"] = most_common(total_words, config.top_words)
    stats["inputs"] = inputs
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), stats)
    logger.info("%d input(s): %d docs, %d bytes", len(inputs), stats["docs"], stats["bytes"])


def _describe(
    input_path: str, tokenizer: Tokenizer | None, config: CorpusStatsConfig
) -> tuple[dict[str, Any], Counter[str]]:
    """One input's figures, and its full word counts for the totals."""
    docs = total_bytes = whitespace_tokens = 0
    sources: Counter[str] = Counter()
    words: Counter[str] = Counter()
    report = ReadReport()
    for record in read_records(input_path, report):
        text = record["text"]
        docs += 1
        total_bytes += len(text.encode("utf-8"))
        whitespace_tokens += len(text.split())
        sources[record["source"] or "unknown"] += 1
        words.update(_WORD.findall(text.lower()))
    described: dict[str, Any] = {
        "input_path": input_path,
        "sources": dict(sorted(sources.items())),
        "docs": docs,
        "bytes": total_bytes,
        "whitespace_tokens": whitespace_tokens,
        "bad_input": dict(report.bad),
        "bad_samples": report.samples,
    }
    if tokenizer is not None:
        texts = (record["text"] for record in read_records(input_path))
        measured = measure(tokenizer, texts, config.encode_batch_size)
        described["tokens"] = measured["tokens"]
        described["tokens_per_byte"] = measured["tokens_per_byte"]
    described["top_words"] = most_common(words, config.top_words)
    logger.info("%s: %d docs, %d bytes", input_path, docs, total_bytes)
    return described, words


def most_common(counts: Counter[str], limit: int) -> list[list[str | int]]:
    """The `limit` most common words as [word, count], ties broken alphabetically so output is stable."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [[word, count] for word, count in ranked[:limit]]
