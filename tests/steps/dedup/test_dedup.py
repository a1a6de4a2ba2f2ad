"""Exact and fuzzy dedup on the real offline corpus with planted duplicates, plus their building blocks."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from executor.shards.writer import read_shard_markers
from steps.corpora.dedup_eval import evaluate_fuzzy_dedup
from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus, read_ground_truth
from steps.data.documents import ReadReport, list_input_files, read_documents, read_shard_table
from steps.dedup.connected_components import large_star, small_star
from steps.dedup.dedup_exact import ExactDedupConfig, _cut, exact_dedup, paragraph_spans
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, bucket_pairs, fuzzy_dedup
from steps.dedup.minhash import MinHasher, jaccard, normalize, normalized_bytes, shingles


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("corpus"))
    build_real_corpus(RealCorpusConfig(output_path=path, docs_per_domain=80, near_copies=6,
                                       near_levels=[0.5, 0.8, 0.9]))  # fmt: skip
    return path


def ids_in(folder: str) -> set[str]:
    return {row for path in list_input_files(folder) for row in read_shard_table(path).column("id").to_pylist()}


def test_shingles_match_a_plain_python_reference():
    texts = ["The quick brown fox, jumps over 12 lazy dogs!", "one two", "", "a b c d e f"]
    hashes, offsets = shingles(texts, 3)
    assert offsets.tolist() == [0, 7, 7, 7, 11]
    assert len(set(hashes[:7].tolist())) == 7
    assert jaccard("a b c d e f g", "A b, c d e f g") == 1.0
    assert jaccard("a b c d e f g h", "a b c d e f g x") == pytest.approx(3 / 5)


def test_normalisation_turns_punctuation_into_spaces_and_folds_diacritics():
    assert normalize("state-of-the-art").split() == ["state", "of", "the", "art"]
    assert normalize("x=1+2").split() == ["x", "0", "0"]
    assert normalize("Café NAÏVE").split() == normalize("cafe\u0301 naive").split() == ["cafe", "naive"]
    assert jaccard("a state-of-the-art model, for x=1+2 here", "A state of the art model for x = 1 + 2 here") == 1.0
    assert jaccard("one two three four five six", "one two three four five sixty") < 1.0


def test_batch_normalisation_is_normalize_on_every_text():
    # Shingling normalizes a whole batch at once (numbers collapsed in numpy, not by a regex per text).
    texts = [
        "1,000.5 apples", "x=1+2", "a1b22c333", "1..2", ".5", "5.", "3,", ",3", "\u0663\u0664 and \u0661,\u0662",
        "v2.0.1-rc", "pi 3.14159, e 2.71", "", "   ", "00.00,00", "a.b,c", "1\n2", "Café 1.2.3 NAÏVE", "9",
    ]  # fmt: skip
    expected = ("\n".join(normalize(text) for text in texts) + "\n").encode()
    assert normalized_bytes(texts).tobytes() == expected
    assert normalize("\u0663\u0664 and \u0661,\u0662 1..2").split() == ["0", "and", "0", "0", "0"]


def test_minhash_estimates_jaccard():
    rng = random.Random(0)
    words = [f"w{rng.randrange(5000)}" for _ in range(600)]
    changed = [word if rng.random() > 0.05 else "zz" for word in words]
    first, second = " ".join(words), " ".join(changed)
    signatures, has = MinHasher(bands=32, rows=8).signatures([first, second])
    assert has.all()
    estimate = float(np.mean(signatures[0] == signatures[1]))
    assert abs(estimate - jaccard(first, second)) < 0.08


def components_by_union_find(edges: list[tuple[int, int]]) -> dict[int, int]:
    parent: dict[int, int] = {}

    def find(node: int) -> int:
        parent.setdefault(node, node)
        while parent[node] != node:
            node = parent[node]
        return node

    for first, second in edges:
        low, high = sorted((find(first), find(second)))
        parent[high] = low
    return {node: find(node) for node in parent}


def test_star_rounds_find_the_same_components_as_union_find():
    rng = random.Random(1)
    edges = [(rng.randrange(300), rng.randrange(300)) for _ in range(250)]
    edges = [(a, b) for a, b in edges if a != b]
    source = np.array([a for a, b in edges] + [b for a, b in edges], dtype=np.int64)
    target = np.array([b for a, b in edges] + [a for a, b in edges], dtype=np.int64)
    for _round in range(40):
        pairs = np.unique(np.stack([source, target], 1), axis=0)
        first, second = large_star(pairs[:, 0], pairs[:, 1])
        pairs = np.unique(np.stack([np.concatenate([first, second]), np.concatenate([second, first])], 1), axis=0)
        first, second = small_star(pairs[:, 0], pairs[:, 1])
        source, target = np.concatenate([first, second]), np.concatenate([second, first])
    found = {int(node): int(min(node, root)) for node, root in zip(source, target, strict=True) if root < node}
    expected = components_by_union_find(edges)
    assert found == {node: root for node, root in expected.items() if node != root}


def test_bucket_pairs_are_all_pairs_of_small_buckets_and_a_star_in_large_ones():
    band_key = np.array([1, 1, 1, 2, 3, 3, 3, 3], dtype=np.uint64)
    doc = np.array([10, 11, 12, 13, 20, 21, 22, 23], dtype=np.int64)
    earlier, later = bucket_pairs(band_key, doc, all_pairs_up_to=3)
    assert sorted(zip(earlier.tolist(), later.tolist(), strict=True)) == [
        (10, 11), (10, 12), (11, 12), (20, 21), (20, 22), (20, 23)]  # fmt: skip


def test_exact_dedup_drops_planted_copies_and_repeated_paragraphs(corpus, tmp_path):
    output = str(tmp_path / "exact")
    exact_dedup(ExactDedupConfig(input_paths=[f"{corpus}/raw"], output_path=output))
    truth = read_ground_truth(corpus)
    planted_exact = {record["id"] for record in truth if record["kind"] == "exact"}
    kept = ids_in(f"{output}/docs")
    assert not planted_exact & kept
    # Each copied text survives once; its first occurrence may be a source document that an original repeats.
    texts = {document["id"]: document["text"] for path in list_input_files(f"{corpus}/raw")
             for document in read_documents(path, ReadReport())}  # fmt: skip
    kept_texts = {texts[doc_id] for doc_id in kept}
    assert {texts[record["of"]] for record in truth if record["kind"] == "exact"} <= kept_texts
    stats = json.loads(open(f"{output}/stats.json").read())
    assert stats["dropped"]["exact_duplicate"] >= len(planted_exact)
    assert stats["docs_in"] - stats["docs_out"] == sum(stats["dropped"].values())


def test_paragraph_cuts_record_spans_of_the_original():
    text = "First paragraph here.\n\nSecond one, repeated.\n  \nThird.\n"
    spans = paragraph_spans(text)
    assert [text[start:end] for start, end in spans] == ["First paragraph here.", "Second one, repeated.", "Third."]
    cut, cuts = _cut(text, {1})
    assert cut == "First paragraph here.\n\nThird.\n"
    assert cuts == [[23, 48]]


def test_fuzzy_dedup_finds_planted_near_copies_and_resumes(corpus, tmp_path):
    output = str(tmp_path / "fuzzy")
    config = FuzzyDedupConfig(input_paths=[f"{corpus}/raw"], output_path=output, parallelism="thread")
    fuzzy_dedup(config)
    figures = evaluate_fuzzy_dedup(corpus, output)
    assert figures["recall"]["exact"] == 1.0
    assert figures["recall"]["0.90"] == 1.0
    assert figures["recall"]["0.80"] >= 0.95
    assert figures["recall"]["0.50"] <= 0.1
    assert figures["precision"] == 1.0
    stats = json.loads(open(f"{output}/stats.json").read())
    assert stats["rejected_pairs"] > 0
    assert stats["verified_pairs"] + stats["rejected_pairs"] == stats["candidate_pairs"]
    clusters = [row for path in list_input_files(f"{output}/clusters") for row in read_shard_table(path).to_pylist()]
    assert all(sum(r["kept"] for r in clusters if r["cluster_id"] == c["cluster_id"]) == 1 for c in clusters)
    before = read_shard_markers(output)
    fuzzy_dedup(config)
    assert read_shard_markers(output) == before
