"""Measure fuzzy dedup against the planted duplicates of a `build_real_corpus` output.

Recall, per planted similarity level: the share of planted copies that were dropped.
Precision: the share of dropped documents that really are near duplicates of the document their
cluster kept — exact shingle Jaccard (`steps/dedup/minhash.jaccard`) of at least `min_jaccard`. Real text
has duplicates nobody planted (the stdlib's `encodings/cp*.py` are near copies of one another),
so precision is judged by measured similarity, not by the planted list alone.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from executor import storage
from steps.corpora.real_corpus import read_ground_truth
from steps.data.documents import ReadReport, list_input_files, read_documents, read_shard_table
from steps.dedup.minhash import jaccard


def evaluate_fuzzy_dedup(corpus_path: str, dedup_path: str, min_jaccard: float = 0.5) -> dict[str, Any]:
    truth = read_ground_truth(corpus_path)
    texts = {document["id"]: document["text"]
             for path in list_input_files(storage.join(corpus_path, "raw"))
             for document in read_documents(path, ReadReport())}  # fmt: skip
    clusters: dict[str, str] = {}
    kept_by_cluster: dict[str, str] = {}
    for path in list_input_files(storage.join(dedup_path, "clusters")):
        for row in read_shard_table(path).to_pylist():
            clusters[row["id"]] = row["cluster_id"]
            if row["kept"]:
                kept_by_cluster[row["cluster_id"]] = row["id"]
    dropped = {doc_id for doc_id, cluster in clusters.items() if kept_by_cluster.get(cluster) != doc_id}
    levels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for record in truth:
        kind = record["kind"]
        level = kind if kind == "exact" or kind.startswith("cross") else f"{record['target_jaccard']:.2f}"
        levels[level][0] += record["id"] in dropped
        levels[level][1] += 1
    false_positives = []
    for doc_id in sorted(dropped):
        similarity = jaccard(texts[doc_id], texts[kept_by_cluster[clusters[doc_id]]])
        if similarity < min_jaccard:
            false_positives.append({"id": doc_id, "kept": kept_by_cluster[clusters[doc_id]], "jaccard": similarity})
    return {
        "recall": {level: found / total for level, (found, total) in sorted(levels.items())},
        "planted": {level: total for level, (_found, total) in sorted(levels.items())},
        "dropped": len(dropped),
        "dropped_unplanted": len(dropped - {record["id"] for record in truth}),
        "precision": 1 - len(false_positives) / len(dropped) if dropped else 1.0,
        "false_positives": false_positives[:10],
    }
