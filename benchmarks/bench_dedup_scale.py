"""Exact and fuzzy dedup as documents grow 10x: per-stage seconds and peak memory, side by side in one run.

Each scale runs in a fresh process (so its peak RSS is its own) on a corpus written for it: real text
(the offline corpus' KJV, stdlib and pydoc documents, verbatim) plus synthetic documents drawn from
that text's vocabulary with Zipf-like frequencies, 5% of them near copies (2-50% of words replaced) of
an earlier one, in files of `--docs-per-file` documents. Both steps run with shards in 2 threads of
that process and a small shard memory budget (`--shard-memory-mb`), so partition counts grow with the
input while each shard's working set should not: the peak RSS above the process's baseline (imports,
corpus generation) is the figure to watch.

    python benchmarks/bench_dedup_scale.py              # 10^4 and 10^5 documents
    python benchmarks/bench_dedup_scale.py --large      # and 10^6 (tens of minutes on 2 cores)

Stage seconds come from the shard markers' commit times (each stage's last commit minus the
previous stage's). The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import numpy as np
from results import record

from executor import storage
from executor.shards.writer import read_shard_markers
from executor.store.events import parse_time
from executor.store.layout import SHARD_DIR
from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus
from steps.data.documents import ReadReport, list_input_files, read_documents
from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup

NEAR_COPY_SHARE = 0.05


def real_documents(folder: str) -> list[str]:
    build_real_corpus(RealCorpusConfig(output_path=f"{folder}/real", docs_per_domain=200, near_copies=0))
    report = ReadReport()
    return [doc["text"] for path in list_input_files(f"{folder}/real/raw") for doc in read_documents(path, report)]


EDIT_RATES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
"""Shares of words replaced in near copies: true Jaccard from about 0.9 down to about 0.1."""


def write_corpus(folder: str, documents: int, docs_per_file: int) -> None:
    """Real documents first, then synthetic ones (5% near copies), as JSONL.gz files; the planted
    (copy id, original id) pairs go to `planted.json`."""
    rng = np.random.default_rng(0)
    texts = real_documents(folder)[:documents]
    planted = []
    vocabulary = sorted({word for text in texts for word in text.split()})
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    weights /= weights.sum()
    while len(texts) < documents:
        if len(texts) > 100 and rng.random() < NEAR_COPY_SHARE:
            original = int(rng.integers(len(texts) // 2, len(texts)))
            words = texts[original].split()
            edits = max(1, round(len(words) * EDIT_RATES[len(planted) % len(EDIT_RATES)]))
            for index in rng.choice(len(words), size=min(edits, len(words)), replace=False):
                words[index] = vocabulary[int(rng.integers(len(vocabulary)))]
            planted.append([f"doc-{len(texts)}", f"doc-{original}"])
        else:
            words = [vocabulary[i] for i in rng.choice(len(vocabulary), size=int(rng.integers(60, 160)), p=weights)]
        texts.append(" ".join(words))
    with open(f"{folder}/planted.json", "w") as handle:
        json.dump(planted, handle)
    os.makedirs(f"{folder}/input")
    for start in range(0, documents, docs_per_file):
        lines = "".join(json.dumps({"id": f"doc-{start + offset}", "text": text}) + "\n"
                        for offset, text in enumerate(texts[start : start + docs_per_file]))  # fmt: skip
        with open(f"{folder}/input/part-{start // docs_per_file:05d}.jsonl.gz", "wb") as handle:
            handle.write(gzip.compress(lines.encode(), compresslevel=1))


def stage_seconds(output_path: str, started: float) -> dict[str, float]:
    """Seconds per stage, from the last marker commit of each stage folder (ordered by that time)."""
    ends = {}
    for folder, _dirs, _files in os.walk(output_path):
        if folder.endswith(SHARD_DIR):
            stage = os.path.relpath(os.path.dirname(folder), output_path)
            markers = read_shard_markers(os.path.dirname(folder))
            ends[stage] = max(parse_time(marker["committed"]).timestamp() for marker in markers.values())
    seconds, previous = {}, started
    for stage, end in sorted(ends.items(), key=lambda item: item[1]):
        seconds[stage], previous = round(end - previous, 2), end
    return seconds


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_scale(documents: int, docs_per_file: int, shard_memory_mb: int) -> dict[str, Any]:
    """One scale, in this (fresh) process: write the corpus, run both steps, measure."""
    folder = tempfile.mkdtemp(prefix=f"bench-dedup-{documents}-")
    write_corpus(folder, documents, docs_per_file)
    baseline = peak_rss_mb()
    budget = shard_memory_mb * 1024 * 1024
    figures: dict[str, Any] = {"docs": documents, "files": len(os.listdir(f"{folder}/input"))}
    for name, step, config in (
        ("exact", exact_dedup, ExactDedupConfig(input_paths=[f"{folder}/input"], output_path=f"{folder}/exact",
                                                shard_memory_bytes=budget, parallelism="thread")),
        ("fuzzy", fuzzy_dedup, FuzzyDedupConfig(input_paths=[f"{folder}/input"], output_path=f"{folder}/fuzzy",
                                                shard_memory_bytes=budget, parallelism="thread")),
    ):  # fmt: skip
        started = time.time()
        step(config)
        stats = storage.read_json(f"{config.output_path}/stats.json")
        seconds = round(time.time() - started, 2)
        figures[name] = {"seconds": seconds, "docs_out": stats["docs_out"], "layout": stats["layout"],
                         "stage_seconds": stage_seconds(config.output_path, started)}  # fmt: skip
    figures["baseline_rss_mb"] = round(baseline, 1)
    figures["peak_rss_mb"] = round(peak_rss_mb(), 1)
    figures["peak_rss_above_baseline_mb"] = round(peak_rss_mb() - baseline, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="also run 10^6 documents")
    parser.add_argument("--docs-per-file", type=int, default=5000)
    parser.add_argument("--shard-memory-mb", type=int, default=4)
    args = parser.parse_args()
    scales = [10_000, 100_000] + ([1_000_000] if args.large else [])
    results = []
    for documents in scales:
        # A fresh process per scale: its peak RSS is its own, not the largest scale's so far.
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            figures = pool.submit(run_scale, documents, args.docs_per_file, args.shard_memory_mb).result()
        print(json.dumps(figures))
        results.append(figures)
    growth = results[1]["peak_rss_above_baseline_mb"] / max(results[0]["peak_rss_above_baseline_mb"], 1.0)
    figures = {
        "benchmark": "dedup_scale", "shard_memory_mb": args.shard_memory_mb, "docs_per_file": args.docs_per_file,
        "scales": results, "rss_above_baseline_growth_10x_docs": round(growth, 2),
    }  # fmt: skip
    record("bench_dedup_scale", figures, parser, args)


if __name__ == "__main__":
    main()
