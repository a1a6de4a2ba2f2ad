"""fastText filter throughput vs raw `model.predict` on the same documents, in one run.

"raw" is the floor: `model.predict` on the documents already flattened to one line each. "ours"
is `steps.filter.fasttext_quality.score_texts` (flattening, the batched predict over every label, and
picking the positive label's probability) plus the keep decision, on the same documents.

    python benchmarks/bench_fasttext.py

Prints a JSON line last: docs/s for both and their ratio (goal: ours >= 0.8x raw).
"""

from __future__ import annotations

import tempfile
import time

import numpy as np
from results import record

from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus
from steps.data.documents import ReadReport, list_input_files, read_documents
from steps.filter.fasttext_quality import TrainClassifierConfig, fasttext_line, load_model, score_texts
from steps.filter.fasttext_quality import train_quality_classifier as train


def main() -> None:
    folder = tempfile.mkdtemp(prefix="bench-fasttext-")
    build_real_corpus(RealCorpusConfig(output_path=folder, docs_per_domain=400))
    train(TrainClassifierConfig(positive_paths=[f"{folder}/raw/reference_pydoc.parquet"],
                                negative_paths=[f"{folder}/raw/prose_kjv.jsonl.gz"], output_path=f"{folder}/model",
                                dim=32, bucket=100_000))  # fmt: skip
    model = load_model(f"{folder}/model")
    report = ReadReport()
    texts = [doc["text"] for path in list_input_files(f"{folder}/raw") for doc in read_documents(path, report)]
    texts = texts * 3
    lines = [fasttext_line(text) for text in texts]
    start = time.perf_counter()
    model.predict(lines)
    raw = time.perf_counter() - start
    start = time.perf_counter()
    scores = score_texts(model, texts)
    kept = int(np.sum(scores >= 0.5))
    ours = time.perf_counter() - start
    figures = {
        "benchmark": "fasttext_filter",
        "docs": len(texts),
        "kept": kept,
        "raw_predict_docs_per_s": round(len(texts) / raw, 1),
        "ours_docs_per_s": round(len(texts) / ours, 1),
        "ratio": round(raw / ours, 3),
    }
    record("bench_fasttext", figures)


if __name__ == "__main__":
    main()
