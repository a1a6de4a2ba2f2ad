"""End-to-end fuzzy dedup: our step (steps/dedup/dedup_fuzzy.py) vs datatrove's 4-stage MinHash pipeline, and recall
and precision on planted near-duplicates whose true Jaccard similarity is measured.

Corpus: the offline real corpus (KJV, stdlib, pydoc) plus synthetic documents drawn from its vocabulary
(`bench_dedup_scale.write_corpus`), 5% of them near copies of an earlier document with 2-50% of words
replaced, `--docs` in all, as `--files` JSONL.gz files. Each planted pair's true 5-gram Jaccard is
*measured* afterwards with our normalization (`steps.dedup.minhash.jaccard`), not assumed from the edit rate.

Both sides use the same settings (5-grams, 16 bands x 6 rows, 64-bit shingle hashes), the same
parallelism (one process per CPU) and the same output format (zstd Parquet: our step's format, and
datatrove's ParquetWriter with zstd), one after the other in one run:

- ours: signatures -> LSH buckets -> pair verification -> partitioned connected components ->
  assignment -> filter, i.e. the whole `fuzzy_dedup` step; stage seconds from its shard markers;
- datatrove: JsonlReader + MinhashDedupSignature (one task per file) -> MinhashDedupBuckets (one
  task per band) -> MinhashDedupCluster (one task: their single-CPU union-find) -> JsonlReader +
  MinhashDedupFilter + ParquetWriter (one task per file); stage seconds timed around each stage.

Kept counts differ by design: ours verifies candidate pairs (Jaccard >= 0.65 estimated from the
signatures) and drops a document only for a kept one it matches (chains of near copies are split into
stars, `steps/dedup/representatives.py`); datatrove keeps every LSH collision and drops whole connected
components but one, so it drops more (pairs at J ~ 0.4-0.6 and chain ends included).

    python benchmarks/bench_fuzzy_dedup.py [--docs 20000] [--files 4]

The last line is one JSON object: seconds per stage and in all, docs/s, kept counts, the throughput
ratio, and recall (pairs at J >= 0.75) and precision (dropped documents at J >= 0.5 with the kept one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from typing import Any

import pyarrow.parquet as pq
from bench_dedup_scale import stage_seconds, write_corpus
from results import record

from steps.data.documents import ReadReport, list_input_files, read_documents
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.dedup.minhash import jaccard

N_GRAMS, BANDS, ROWS = 5, 16, 6


def run_ours(input_folder: str, output: str) -> tuple[float, int, dict[str, float]]:
    """Seconds for the whole step (its shards use a process per CPU), the documents it kept, seconds per stage."""
    started, start = time.time(), time.perf_counter()
    fuzzy_dedup(FuzzyDedupConfig(input_paths=[input_folder], output_path=output, n_grams=N_GRAMS, bands=BANDS,
                                 rows=ROWS))  # fmt: skip
    elapsed = time.perf_counter() - start
    with open(f"{output}/stats.json") as handle:
        return elapsed, int(json.load(handle)["docs_out"]), stage_seconds(output, started)


def run_datatrove(input_folder: str, work: str, files: int, workers: int) -> tuple[float, int, dict[str, float]]:
    """Seconds for the four stages, the documents the last one wrote, seconds per stage."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import ParquetWriter
    from datatrove.utils.hashing import HashConfig

    config = MinhashConfig(n_grams=N_GRAMS, num_buckets=BANDS, hashes_per_bucket=ROWS,
                           hash_config=HashConfig(precision=64))  # fmt: skip
    stages: list[dict[str, Any]] = [
        {"pipeline": [JsonlReader(input_folder), MinhashDedupSignature(output_folder=f"{work}/signatures",
                                                                       config=config)], "tasks": files},
        {"pipeline": [MinhashDedupBuckets(input_folder=f"{work}/signatures", output_folder=f"{work}/buckets",
                                          config=config)], "tasks": BANDS},
        {"pipeline": [MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids",
                                          config=config)], "tasks": 1},
        {"pipeline": [JsonlReader(input_folder), MinhashDedupFilter(input_folder=f"{work}/remove_ids"),
                      ParquetWriter(f"{work}/output", compression="zstd")], "tasks": files},
    ]  # fmt: skip
    seconds = {}
    for name, stage in zip(("signatures", "buckets", "cluster", "filter"), stages, strict=True):
        start = time.perf_counter()
        LocalPipelineExecutor(pipeline=stage["pipeline"], tasks=stage["tasks"], workers=min(workers, stage["tasks"]),
                              logging_dir=f"{work}/logs/{name}").run()  # fmt: skip
        seconds[name] = round(time.perf_counter() - start, 2)
    kept = sum(pq.read_metadata(f"{work}/output/{name}").num_rows for name in os.listdir(f"{work}/output"))
    return sum(seconds.values()), kept, seconds


def planted_quality(folder: str, output: str) -> dict[str, Any]:
    """Recall on planted pairs at measured J >= 0.75 and precision of drops (J >= 0.5 with the kept document).

    Recall counts a pair as found when the two do not both survive (`recall_at_0_75`); `same_cluster_at_0_75`
    is the stricter share whose two documents share a cluster, which a chain split at its far end lowers
    although nothing duplicated survives."""
    report = ReadReport()
    paths = list_input_files(f"{folder}/input")
    texts = {doc["id"]: doc["text"] for path in paths for doc in read_documents(path, report)}
    with open(f"{folder}/planted.json") as handle:
        planted = json.load(handle)
    cluster_of, kept_of = {}, {}
    for path in list_input_files(f"{output}/clusters"):
        for row in pq.read_table(path).to_pylist():
            cluster_of[row["id"]] = row["cluster_id"]
            if row["kept"]:
                kept_of[row["cluster_id"]] = row["id"]
    dropped = [doc_id for doc_id, cluster in cluster_of.items() if kept_of.get(cluster) != doc_id]
    similar = [(copy, original) for copy, original in planted if jaccard(texts[copy], texts[original]) >= 0.75]
    removed = set(dropped)
    found = sum(1 for copy, original in similar if copy in removed or original in removed)
    together = sum(1 for copy, original in similar if cluster_of.get(copy, copy) == cluster_of.get(original))
    true_drops = sum(1 for doc_id in dropped if jaccard(texts[doc_id], texts[kept_of[cluster_of[doc_id]]]) >= 0.5)
    return {"planted_pairs": len(planted), "pairs_at_jaccard_0_75": len(similar),
            "recall_at_0_75": round(found / max(len(similar), 1), 4),
            "same_cluster_at_0_75": round(together / max(len(similar), 1), 4), "dropped": len(dropped),
            "precision_at_0_5": round(true_drops / max(len(dropped), 1), 4)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--files", type=int, default=4)
    args = parser.parse_args()
    workers = os.cpu_count() or 1
    logging.basicConfig(level=logging.WARNING)
    folder = tempfile.mkdtemp(prefix="bench-fuzzy-")
    write_corpus(folder, args.docs, -(-args.docs // args.files))
    megabytes = sum(os.path.getsize(f"{folder}/input/{name}") for name in os.listdir(f"{folder}/input")) / 1e6
    print(f"corpus: {args.docs} docs ({megabytes:.1f} MB gzipped) in {args.files} files; {workers} workers")
    ours, ours_kept, ours_stages = run_ours(f"{folder}/input", f"{folder}/ours")
    print(f"ours:      {ours:6.1f} s  {args.docs / ours:8.1f} docs/s  kept {ours_kept}  {ours_stages}")
    theirs, theirs_kept, theirs_stages = run_datatrove(f"{folder}/input", f"{folder}/datatrove", args.files, workers)
    print(f"datatrove: {theirs:6.1f} s  {args.docs / theirs:8.1f} docs/s  kept {theirs_kept}  {theirs_stages}")
    quality = planted_quality(folder, f"{folder}/ours")
    record("bench_fuzzy_dedup", {
        "benchmark": "fuzzy_dedup_end_to_end", "docs": args.docs, "files": args.files, "workers": workers,
        "n_grams": N_GRAMS, "bands": BANDS, "rows": ROWS,
        "ours_s": round(ours, 2), "ours_docs_per_s": round(args.docs / ours, 1), "ours_kept": ours_kept,
        "ours_stage_s": ours_stages, "datatrove_s": round(theirs, 2),
        "datatrove_docs_per_s": round(args.docs / theirs, 1), "datatrove_kept": theirs_kept,
        "datatrove_stage_s": theirs_stages, "ratio": round(theirs / ours, 2), **quality,
    }, parser, args)  # fmt: skip


if __name__ == "__main__":
    main()
