"""Fuzzy dedup on chains of near copies (A ~ B ~ C ~ D ~ E, each link at Jaccard 0.8, J(A, E) 0.39): a dropped
document must match the document its cluster keeps, not only some neighbour in a chain."""

from __future__ import annotations

import json
import random

import numpy as np

from steps.data.documents import list_input_files, read_shard_table
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.dedup.minhash import jaccard
from steps.dedup.representatives import greedy_representatives

WORDS, SHIFT, CHAIN = 400, 44, 5


def chain_corpus(folder: str, chains: int = 30, singles: int = 60) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Documents (id -> text) in two JSONL files, and the chains' links (earlier, later) in input order."""
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    texts: dict[str, str] = {}
    links = []
    for chain in range(chains):
        words = ["".join(rng.choices(letters, k=7)) for _ in range(WORDS + SHIFT * (CHAIN - 1))]
        for step in range(CHAIN):
            texts[f"chain{chain}-{step}"] = " ".join(words[step * SHIFT : step * SHIFT + WORDS])
            if step:
                links.append((f"chain{chain}-{step - 1}", f"chain{chain}-{step}"))
    for single in range(singles):
        texts[f"single{single}"] = " ".join("".join(rng.choices(letters, k=7)) for _ in range(300))
    ids = list(texts)
    for part, half in enumerate((ids[: len(ids) // 2], ids[len(ids) // 2 :])):
        with open(f"{folder}/part-{part}.jsonl", "w") as handle:
            handle.writelines(json.dumps({"id": doc_id, "text": texts[doc_id]}) + "\n" for doc_id in half)
    return texts, links


def clusters_of(output: str) -> tuple[dict[str, str], dict[str, str]]:
    cluster_of, kept_of = {}, {}
    for path in list_input_files(f"{output}/clusters"):
        for row in read_shard_table(path).to_pylist():
            cluster_of[row["id"]] = row["cluster_id"]
            if row["kept"]:
                kept_of[row["cluster_id"]] = row["id"]
    return cluster_of, kept_of


def test_chained_near_copies_are_dropped_only_against_the_document_their_cluster_keeps(tmp_path):
    (tmp_path / "raw").mkdir()
    texts, links = chain_corpus(str(tmp_path / "raw"))
    first, second, *_, last = (f"chain0-{step}" for step in range(CHAIN))
    assert jaccard(texts[first], texts[second]) > 0.79 and jaccard(texts[first], texts[last]) < 0.4
    output = str(tmp_path / "fuzzy")
    fuzzy_dedup(FuzzyDedupConfig(input_paths=[str(tmp_path / "raw")], output_path=output, parallelism="thread"))
    cluster_of, kept_of = clusters_of(output)
    dropped = [doc_id for doc_id, cluster in cluster_of.items() if kept_of[cluster] != doc_id]
    similarity = {doc_id: jaccard(texts[doc_id], texts[kept_of[cluster_of[doc_id]]]) for doc_id in dropped}
    precision = sum(value >= 0.5 for value in similarity.values()) / len(dropped)
    assert precision == 1.0, sorted(similarity.items(), key=lambda item: item[1])[:5]
    kept_ids = {
        row for path in list_input_files(f"{output}/docs") for row in read_shard_table(path).column("id").to_pylist()
    }
    both_kept = [link for link in links if set(link) <= kept_ids]
    assert len(both_kept) <= 0.02 * len(links), both_kept
    assert all(f"single{single}" in kept_ids for single in range(60))
    stats = json.loads(open(f"{output}/stats.json").read())
    assert stats["chain_splits"]["split_off"] >= 25


def test_greedy_representatives_take_only_members_that_match_them():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**32, size=(1, 100), dtype=np.uint32)
    near, far = base.copy(), base.copy()
    near[0, :20] += 1
    far[0, :60] += 1
    signature = np.concatenate([base, near, far, far, base])
    root = np.array([5, 5, 5, 5, 9])
    doc = np.array([5, 6, 7, 8, 9])
    representative = greedy_representatives(root, doc, signature, threshold=0.65)
    assert representative.tolist() == [5, 5, 7, 7, 9]
