"""Fuzzy dedup on chains of near copies: a dropped document must match the document its cluster keeps, not only
some neighbour in a chain. Two corpora: A ~ B ~ C with links at Jaccard 0.71 and J(A, C) = 0.49 (links this
loose pass LSH and verification ~80% of the time each), and A ~ B ~ C ~ D ~ E with links at 0.8 (found almost
always) and J(A, E) = 0.39. Jaccard distance is a metric, so two links at >= 0.75 cannot end below J = 0.5: a
chain that does takes looser links or more of them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from steps.data.documents import list_input_files, read_shard_table
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.dedup.minhash import jaccard
from steps.dedup.representatives import greedy_representatives

WORDS = 400
LONG_CHAINS = (44, 5)
"""(words shifted per link, documents per chain): links at J = 0.8, J(A, E) = 0.39."""
SHORT_CHAINS = (68, 3)
"""Links at J = 0.71, J(A, C) = 0.49."""


def chain_corpus(folder: str, shift: int, chain_length: int, chains: int = 30, singles: int = 60
                 ) -> tuple[dict[str, str], list[tuple[str, str]]]:  # fmt: skip
    """Documents (id -> text) in two JSONL files, and the chains' links (earlier, later) in input order."""
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    texts: dict[str, str] = {}
    links = []
    for chain in range(chains):
        words = ["".join(rng.choices(letters, k=7)) for _ in range(WORDS + shift * (chain_length - 1))]
        for step in range(chain_length):
            texts[f"chain{chain}-{step}"] = " ".join(words[step * shift : step * shift + WORDS])
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


def dedup_chains(folder: Path, shift: int, chain_length: int) -> tuple[dict[str, float], set[str], int, dict]:
    """Fuzzy dedup of a chain corpus: each dropped document's exact Jaccard with the document its cluster keeps,
    the kept ids, how many links (near-copy pairs) survive twice, and stats.json."""
    (folder / "raw").mkdir()
    texts, links = chain_corpus(str(folder / "raw"), shift, chain_length)
    output = str(folder / "fuzzy")
    fuzzy_dedup(FuzzyDedupConfig(input_paths=[str(folder / "raw")], output_path=output, parallelism="thread"))
    cluster_of, kept_of = clusters_of(output)
    dropped = [doc_id for doc_id, cluster in cluster_of.items() if kept_of[cluster] != doc_id]
    similarity = {doc_id: jaccard(texts[doc_id], texts[kept_of[cluster_of[doc_id]]]) for doc_id in dropped}
    kept_ids = {
        row for path in list_input_files(f"{output}/docs") for row in read_shard_table(path).column("id").to_pylist()
    }
    both_kept = sum(1 for link in links if set(link) <= kept_ids)
    assert all(f"single{single}" in kept_ids for single in range(60))
    assert jaccard(texts["chain0-0"], texts["chain0-1"]) > (0.79 if chain_length == 5 else 0.7)
    assert jaccard(texts["chain0-0"], texts[f"chain0-{chain_length - 1}"]) < (0.4 if chain_length == 5 else 0.5)
    return similarity, kept_ids, both_kept, json.loads(open(f"{output}/stats.json").read())


def test_long_chains_are_dropped_only_against_the_document_their_cluster_keeps(tmp_path: Path) -> None:
    similarity, _kept, both_kept, stats = dedup_chains(tmp_path, *LONG_CHAINS)
    precision = sum(value >= 0.5 for value in similarity.values()) / len(similarity)
    assert precision == 1.0, sorted(similarity.items(), key=lambda item: item[1])[:5]
    assert both_kept <= 0.02 * 30 * 4, "a near copy and its original both survived"
    assert stats["chain_splits"]["split_off"] >= 25


def test_a_to_c_chains_below_half_similarity_never_drop_c_for_a(tmp_path: Path) -> None:
    similarity, _kept, _both_kept, stats = dedup_chains(tmp_path, *SHORT_CHAINS)
    assert similarity and min(similarity.values()) >= 0.5, sorted(similarity.items(), key=lambda item: item[1])[:5]
    assert stats["chain_splits"]["split_off"] >= 5, "the corpus should hold verified A ~ B ~ C chains"


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
