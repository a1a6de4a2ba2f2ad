"""End-to-end fuzzy dedup: our step (steps/dedup_fuzzy.py) vs datatrove's 4-stage MinHash pipeline.

Same corpus (the offline real corpus with planted duplicates, rewritten as `--files` JSONL.gz
files of id / text / source, which both read), same settings (5-grams, 16 bands x 6 rows, 64-bit
shingle hashes), same parallelism (one process per CPU: the step's local process pool for ours,
`LocalPipelineExecutor(workers=CPUs)` for datatrove), measured one after the other in one run:

- ours: signatures -> LSH buckets -> pair verification -> partitioned connected components ->
  assignment -> filter, i.e. the whole `fuzzy_dedup` step, writing Parquet;
- datatrove: JsonlReader + MinhashDedupSignature (one task per file) -> MinhashDedupBuckets (one
  task per band) -> MinhashDedupCluster (one task: their single-CPU union-find) -> JsonlReader +
  MinhashDedupFilter + JsonlWriter (one task per file).

The docs each kept are printed too: ours verifies candidate pairs (Jaccard >= 0.65 estimated from
the signatures), datatrove keeps every LSH collision, so it drops somewhat more.

    python benchmarks/bench_fuzzy_dedup.py [--docs-per-domain 1000] [--files 4]

Prints docs/s for each and the ratio; the last line is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import tempfile
import time
from typing import Any

from steps.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.documents import ReadReport, list_input_files, read_documents
from steps.real_corpus import RealCorpusConfig, build_real_corpus

N_GRAMS, BANDS, ROWS = 5, 16, 6


def write_corpus(folder: str, docs_per_domain: int, files: int) -> tuple[str, int, float]:
    """The real corpus as `files` JSONL.gz files, documents dealt round-robin; (folder, docs, MB)."""
    build_real_corpus(RealCorpusConfig(output_path=f"{folder}/corpus", docs_per_domain=docs_per_domain))
    report = ReadReport()
    documents = [document for path in list_input_files(f"{folder}/corpus/raw")
                 for document in read_documents(path, report)]  # fmt: skip
    input_folder = f"{folder}/input"
    os.makedirs(input_folder)
    for index in range(files):
        lines = [json.dumps({"id": doc["id"], "text": doc["text"], "source": doc["source"]}) + "\n"
                 for doc in documents[index::files]]  # fmt: skip
        with gzip.open(f"{input_folder}/part-{index:03d}.jsonl.gz", "wt", encoding="utf-8") as handle:
            handle.writelines(lines)
    megabytes = sum(len(doc["text"].encode()) for doc in documents) / 1e6
    return input_folder, len(documents), megabytes


def run_ours(input_folder: str, output: str) -> tuple[float, int]:
    """Seconds for the whole step (its shards use a process per CPU) and the documents it kept."""
    start = time.perf_counter()
    fuzzy_dedup(FuzzyDedupConfig(input_paths=[input_folder], output_path=output, n_grams=N_GRAMS, bands=BANDS,
                                 rows=ROWS))  # fmt: skip
    elapsed = time.perf_counter() - start
    with open(f"{output}/stats.json") as handle:
        return elapsed, int(json.load(handle)["docs_out"])


def run_datatrove(input_folder: str, work: str, files: int, workers: int) -> tuple[float, int]:
    """Seconds for the four stages and the documents the last one wrote."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
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
                      JsonlWriter(f"{work}/output")], "tasks": files},
    ]  # fmt: skip
    start = time.perf_counter()
    for number, stage in enumerate(stages):
        LocalPipelineExecutor(pipeline=stage["pipeline"], tasks=stage["tasks"], workers=min(workers, stage["tasks"]),
                              logging_dir=f"{work}/logs/stage-{number}").run()  # fmt: skip
    elapsed = time.perf_counter() - start
    kept = 0
    for name in sorted(os.listdir(f"{work}/output")):
        with gzip.open(f"{work}/output/{name}", "rt", encoding="utf-8") as handle:
            kept += sum(1 for _line in handle)
    return elapsed, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs-per-domain", type=int, default=1000)
    parser.add_argument("--files", type=int, default=4)
    args = parser.parse_args()
    workers = os.cpu_count() or 1
    logging.basicConfig(level=logging.WARNING)
    folder = tempfile.mkdtemp(prefix="bench-fuzzy-")
    input_folder, docs, megabytes = write_corpus(folder, args.docs_per_domain, args.files)
    print(f"corpus: {docs} docs, {megabytes:.1f} MB in {args.files} files; {workers} workers; "
          f"{N_GRAMS}-grams, {BANDS} bands x {ROWS} rows")  # fmt: skip
    ours, ours_kept = run_ours(input_folder, f"{folder}/ours")
    print(f"ours:      {ours:6.1f} s  {docs / ours:8.1f} docs/s  kept {ours_kept}")
    theirs, theirs_kept = run_datatrove(input_folder, f"{folder}/datatrove", args.files, workers)
    print(f"datatrove: {theirs:6.1f} s  {docs / theirs:8.1f} docs/s  kept {theirs_kept}")
    print(f"ours / datatrove throughput: {theirs / ours:.2f}x")
    print(json.dumps({
        "benchmark": "fuzzy_dedup_end_to_end", "docs": docs, "mb": round(megabytes, 2), "files": args.files,
        "workers": workers, "n_grams": N_GRAMS, "bands": BANDS, "rows": ROWS,
        "ours_s": round(ours, 2), "ours_docs_per_s": round(docs / ours, 1), "ours_kept": ours_kept,
        "datatrove_s": round(theirs, 2), "datatrove_docs_per_s": round(docs / theirs, 1),
        "datatrove_kept": theirs_kept, "speedup": round(theirs / ours, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
