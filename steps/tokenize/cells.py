"""Topic x quality cells: every document gets a topic cluster and a quality bucket, one document set per cell.

The hero run mixes not raw sources but 200 cells (40 topics x 5 quality buckets), so that a
mixture can upweight, say, the best fifth of every topic without starving any topic. Two stages,
shaped like the dedup steps:

1. fit (one shard, `work/fit/`): read a sample (the first documents of up to `sample_files`
   evenly spaced input files, `sample_docs` in all), fit the topic model of `steps/tokenize/topics.py`
   (TF-IDF + truncated SVD + k-means, trained on the corpus itself), and score the sample with the
   fastText quality classifier: the bucket edges are the sample's score quantiles, so buckets hold
   about equal numbers of documents. Committed like any shard, so a resumed step reuses the very
   same model and a forced rerun refits.
2. assign (one shard per input file): topic = nearest centroid, bucket = where the classifier's
   score falls between the edges; the shard writes `cells/<cell>/shard-SSSSS.parquet` for every cell
   it has documents for, and counts docs, tokens (with the mixture's tokenizer, no special tokens)
   and bytes per cell.

Cells are named `topicTT_qB` (bucket 0 is the lowest quality). A cell that no document falls into
is not an error: it gets an empty `cells/<cell>/empty.parquet` (so a tokenize step per cell reads
zero documents instead of failing), is listed under `empty_cells` and logged.

Outputs: `cells/<cell>/*.parquet`, `composition.json` (per cell: docs, tokens, bytes, token share,
3 sample snippets, the topic's top terms; for the dashboard and the mixture-weights step) and
`stats.json`.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import xxhash

from executor import Shard, ShardReport, ShardWriter, run_sharded, storage
from steps.data.documents import (
    FileShard,
    ReadReport,
    file_shards,
    flow_stats,
    list_input_files,
    merge_stats,
    read_documents,
    table_bytes,
    text_bytes,
    to_table,
    write_stats,
    write_table,
)
from steps.filter.fasttext_quality import load_model, score_texts
from steps.tokenize.topics import TopicModel, fit_topic_model
from steps.tokenize.train_tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

CELLS_DIR = "cells"
COMPOSITION_FILE = "composition.json"
SAMPLES_PER_CELL = 3
SNIPPET_CHARS = 200
_FIT_DIR = "work/fit"
_MODEL_FILE = "topic_model.npz"
_EDGES_FILE = "bucket_edges.json"


@dataclass(frozen=True)
class CellsConfig:
    input_paths: list[str]
    """Document files, folders or globs to split into cells."""
    tokenizer_path: str
    """A train_tokenizer output: cells' token counts are counted with it (a dependency in a DAG)."""
    output_path: str
    """Where cells/, composition.json and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    quality_model_path: str | None = None
    """A train_quality_classifier output whose P(positive) ranks documents into buckets; None: one bucket."""
    topics: int = 40
    """k of k-means: topic clusters. Versioned."""
    quality_buckets: int = 5
    """Quality buckets, equal-count quantiles of the classifier's score on the sample. Versioned."""
    sample_docs: int = 20_000
    """Documents the topic model and the bucket edges are fitted on. Versioned."""
    sample_files: int = 64
    """The sample comes from at most this many input files, evenly spaced. Versioned."""
    embedding_dim: int = 64
    """SVD components of the document embeddings. Versioned."""
    vocab_size: int = 20_000
    """Words in the TF-IDF vocabulary. Versioned."""
    max_df: float = 0.5
    """Words in more than this fraction of sample documents are left out of the vocabulary. Versioned."""
    kmeans_iterations: int = 50
    """At most this many Lloyd iterations (fewer once centroids stop moving). Versioned."""
    seed: int = 0
    """Seeds SVD and k-means. Versioned."""
    top_terms: int = 8
    """Words listed per topic in composition.json. Versioned."""
    raw_input: bool = False
    """Whether an input file with no usable document is an error (True for raw downloads)."""


_EMPTY_SET = table_bytes(to_table([]))
"""What an empty cell's folder holds: a Parquet file of zero documents."""


def cell_name(topic: int, bucket: int, topics: int) -> str:
    return f"topic{topic:0{max(2, len(str(topics - 1)))}d}_q{bucket}"


def cell_names(topics: int, quality_buckets: int) -> list[str]:
    """Every cell, topic-major: what a DAG builds one tokenize step per."""
    return [cell_name(t, b, topics) for t in range(topics) for b in range(quality_buckets)]


def _check(config: CellsConfig) -> None:
    where = f"cells step at {config.output_path}"
    if config.topics < 1 or config.quality_buckets < 1 or config.sample_docs < 1:
        raise ValueError(f"{where}: topics, quality_buckets and sample_docs must be at least 1")
    if config.quality_buckets > 1 and config.quality_model_path is None:
        raise ValueError(f"{where}: {config.quality_buckets} quality buckets need a quality_model_path "
                         "(a train_quality_classifier output); or set quality_buckets=1")  # fmt: skip
    if config.sample_docs < config.topics:
        raise ValueError(f"{where}: sample_docs ({config.sample_docs}) must be at least topics ({config.topics})")


@dataclass(frozen=True)
class _FitPayload:
    config: CellsConfig
    files: list[str]


def _read_sample(config: CellsConfig, files: list[str]) -> list[str]:
    step = max(1, len(files) // config.sample_files)
    chosen = files[::step][: config.sample_files]
    per_file = math.ceil(config.sample_docs / len(chosen))

    def first_texts(path: str) -> list[str]:
        texts: list[str] = []
        for document in read_documents(path, ReadReport(), config.raw_input):
            texts.append(document["text"])
            if len(texts) == per_file:
                break
        return texts

    with ThreadPoolExecutor(max_workers=min(storage.IO_THREADS, len(chosen))) as pool:
        return [text for texts in pool.map(first_texts, chosen) for text in texts][: config.sample_docs]


def _fit_shard(payload: _FitPayload, writer: ShardWriter) -> dict[str, Any]:
    config = payload.config
    texts = _read_sample(config, payload.files)
    if len(texts) < config.topics:
        raise ValueError(f"cells step at {config.output_path}: the sample holds {len(texts)} documents, "
                         f"fewer than topics={config.topics}; lower topics or give it more input")  # fmt: skip
    model = fit_topic_model(texts, config.topics, config.embedding_dim, config.vocab_size, config.max_df,
                            config.kmeans_iterations, config.seed)  # fmt: skip
    edges = np.zeros(0)
    if config.quality_model_path is not None:
        scores = score_texts(load_model(config.quality_model_path), texts)
        edges = np.quantile(scores, np.arange(1, config.quality_buckets) / config.quality_buckets)
    with writer.open(_MODEL_FILE) as handle:
        handle.write(model.to_bytes())
    with writer.open(_EDGES_FILE) as handle:
        handle.write(storage.json_bytes(edges.tolist()))
    return {"rows": len(texts), "bucket_edges": edges.tolist(), "top_terms": model.top_terms(config.top_terms),
            "vocabulary": len(model.vocabulary)}  # fmt: skip


@cache
def _topic_model(path: str, digest: int) -> TopicModel:
    """Parsed once per process and model version (the digest changes when a forced rerun refits)."""
    data = storage.read_bytes(path)
    if data is None or xxhash.xxh64_intdigest(data) != digest:
        raise FileNotFoundError(f"{path} changed or vanished while the cells step ran; rerun the step")
    return TopicModel.from_bytes(data)


def _load_topic_model(output_path: str) -> TopicModel:
    path = storage.join(output_path, _FIT_DIR, _MODEL_FILE)
    data = storage.read_bytes(path)
    if data is None:
        raise FileNotFoundError(f"{path} is missing: the cells step's fit stage did not commit; rerun the step")
    return _topic_model(path, xxhash.xxh64_intdigest(data))


def _assign_shard(payload: FileShard[CellsConfig], writer: ShardWriter) -> dict[str, Any]:
    config = payload.config
    report = ReadReport()
    documents = list(read_documents(payload.path, report, config.raw_input))
    texts = [document["text"] for document in documents]
    topics = _load_topic_model(config.output_path).assign(texts)
    buckets = np.zeros(len(texts), dtype=np.int64)
    if config.quality_model_path is not None:
        edges = storage.read_json(storage.join(config.output_path, _FIT_DIR, _EDGES_FILE))
        scores = score_texts(load_model(config.quality_model_path), texts)
        buckets = np.searchsorted(np.asarray(edges, dtype=np.float64), scores, side="right")
    encodings = load_tokenizer(config.tokenizer_path).encode_batch_fast(texts, add_special_tokens=False)
    by_cell: dict[str, list[int]] = {}
    for row, (topic, bucket) in enumerate(zip(topics.tolist(), buckets.tolist(), strict=True)):
        by_cell.setdefault(cell_name(topic, bucket, config.topics), []).append(row)
    docs, tokens, sizes, samples = {}, {}, {}, []
    for cell, rows in sorted(by_cell.items()):
        write_table(writer, f"{CELLS_DIR}/{cell}/shard-{payload.shard_index:05d}.parquet",
                    to_table(documents[row] for row in rows))  # fmt: skip
        docs[cell] = len(rows)
        tokens[cell] = sum(len(encodings[row].ids) for row in rows)
        sizes[cell] = text_bytes(texts[row] for row in rows)
        samples += [[cell, texts[row][:SNIPPET_CHARS]] for row in rows[:SAMPLES_PER_CELL]]
    stats = flow_stats(report, len(documents), text_bytes(texts))
    stats.update(tokens=sum(tokens.values()), cell_docs=docs, cell_tokens=tokens, cell_bytes=sizes)
    stats["cell_samples"] = samples
    return stats


def _composition(config: CellsConfig, report: ShardReport, fit: dict[str, Any]) -> dict[str, Any]:
    cells: dict[str, dict[str, Any]] = {
        cell_name(t, b, config.topics): {"topic": t, "quality_bucket": b, "docs": 0, "tokens": 0, "bytes": 0,
                                         "samples": []}
        for t in range(config.topics)
        for b in range(config.quality_buckets)
    }  # fmt: skip
    for shard_id in sorted(report.markers):
        stats = report.markers[shard_id]["stats"]
        for key in ("docs", "tokens", "bytes"):
            for cell, value in stats[f"cell_{key}"].items():
                cells[cell][key] += value
        for cell, snippet in stats["cell_samples"]:
            if len(cells[cell]["samples"]) < SAMPLES_PER_CELL:
                cells[cell]["samples"].append(snippet)
    total_tokens = sum(cell["tokens"] for cell in cells.values())
    for cell in cells.values():
        cell["share"] = cell["tokens"] / total_tokens if total_tokens else 0.0
        cell["top_terms"] = fit["top_terms"][cell["topic"]]
    return {"topics": config.topics, "quality_buckets": config.quality_buckets, "bucket_edges": fit["bucket_edges"],
            "docs": sum(cell["docs"] for cell in cells.values()), "tokens": total_tokens,
            "empty_cells": [name for name, cell in cells.items() if cell["docs"] == 0], "cells": cells}  # fmt: skip


def build_cells(config: CellsConfig) -> None:
    _check(config)
    files = list_input_files(config.input_paths)
    fitted = run_sharded(storage.join(config.output_path, _FIT_DIR), [Shard("fit", _FitPayload(config, files))],
                         _fit_shard, description="cells: fit topics")  # fmt: skip
    fit = fitted.markers["fit"]["stats"]
    report = run_sharded(config.output_path, file_shards(config, files), _assign_shard, description="cells: assign")
    composition = _composition(config, report, fit)
    empty = composition["empty_cells"]
    for cell in empty:
        storage.write_atomic(storage.join(config.output_path, CELLS_DIR, cell, "empty.parquet"), _EMPTY_SET)
    if empty:
        logger.warning("cells step at %s: %d of %d cells have no documents: %s", config.output_path, len(empty),
                       len(composition["cells"]), empty[:10])  # fmt: skip
    storage.write_json_atomic(storage.join(config.output_path, COMPOSITION_FILE), composition)
    stats = merge_stats(report)
    for key in ("cell_docs", "cell_tokens", "cell_bytes", "cell_samples"):
        stats.pop(key, None)
    stats.update(cells=len(composition["cells"]), empty_cells=len(composition["empty_cells"]),
                 sample_docs=fit["rows"], vocabulary=fit["vocabulary"])  # fmt: skip
    write_stats(config.output_path, stats)
