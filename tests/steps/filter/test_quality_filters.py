"""Quality heuristics, the fastText classifier and filter, and decontamination, on real offline text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus
from steps.data.documents import list_input_files, read_shard_table
from steps.dedup.minhash import normalize
from steps.filter.decontaminate import DecontaminateConfig, decontaminate
from steps.filter.fasttext_quality import (
    POSITIVE,
    ClassifierTrainingError,
    FasttextFilterConfig,
    TrainClassifierConfig,
    _split,
    fasttext_filter,
    score_keys,
    top_fraction_threshold,
    train_quality_classifier,
)
from steps.filter.quality_heuristics import QualityHeuristicsConfig, quality_heuristics


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("corpus"))
    build_real_corpus(RealCorpusConfig(output_path=path, docs_per_domain=60, exact_copies=0, near_copies=0,
                                       near_levels=[]))  # fmt: skip
    return f"{path}/raw"


def rows(folder: str) -> list[dict]:
    return [row for path in list_input_files(folder) for row in read_shard_table(path).to_pylist()]


def stats_of(output: str) -> dict:
    return json.loads(open(f"{output}/stats.json").read())


@pytest.mark.slow
def test_heuristics_count_drops_by_filter_and_pass_code_through(corpus, tmp_path):
    output = str(tmp_path / "heuristics")
    quality_heuristics(QualityHeuristicsConfig(input_paths=[corpus], output_path=output, skip_sources=["code_*"],
                                               raw_input=True))  # fmt: skip
    stats = stats_of(output)
    assert stats["docs_in"] == 180
    assert stats["docs_in"] - stats["docs_out"] == sum(stats["dropped"].values())
    assert all(reason.split(":")[0] in {"gopher_quality", "gopher_repetition", "c4", "fineweb"}
               for reason in stats["dropped"])  # fmt: skip
    assert stats["skipped_source_docs"] == 60
    assert sum(1 for row in rows(f"{output}/docs") if row["source"] == "code_stdlib") == 60


def classifier_config(corpus: str, output_path: str, **overrides) -> TrainClassifierConfig:
    settings = {"dim": 16, "bucket": 20_000, "epochs": 50, "heldout_fraction": 0.2, **overrides}
    return TrainClassifierConfig(positive_paths=[f"{corpus}/reference_pydoc.parquet"],
                                 negative_paths=[f"{corpus}/prose_kjv.jsonl.gz"], output_path=output_path,
                                 **settings)  # fmt: skip


@pytest.mark.slow
def test_fasttext_trains_and_filters_by_threshold_and_by_quantile(corpus, tmp_path):
    model = str(tmp_path / "model")
    train_quality_classifier(classifier_config(corpus, model))
    trained = stats_of(model)
    assert 10 <= trained["heldout_docs"] <= 40 and trained["heldout_accuracy"] >= 0.95
    assert trained["learning_rate"] == 0.5
    by_threshold = str(tmp_path / "threshold")
    fasttext_filter(FasttextFilterConfig(input_paths=[corpus], model_path=model, output_path=by_threshold,
                                         threshold=0.5))  # fmt: skip
    kept = rows(f"{by_threshold}/docs")
    assert sum(row["source"] == "reference_pydoc" for row in kept) >= 50
    assert sum(row["source"] == "prose_kjv" for row in kept) <= 5
    by_fraction = str(tmp_path / "fraction")
    fasttext_filter(FasttextFilterConfig(input_paths=[corpus], model_path=model, output_path=by_fraction,
                                         keep_fraction=0.5))  # fmt: skip
    stats = stats_of(by_fraction)
    assert abs(stats["docs_out"] - 90) <= 1
    assert len(rows(f"{by_fraction}/scores")) == 180


def test_fasttext_training_is_reproducible_within_one_process(corpus, tmp_path):
    """fastText leaves 9/10 of its input matrix uninitialized with thread=1; a second training in a
    process that freed the first model's memory used to start from stale weights (NaN, or a different
    model for the same seed)."""
    models = [str(tmp_path / f"model-{attempt}") for attempt in range(3)]
    for model in models:
        train_quality_classifier(classifier_config(corpus, model, epochs=5))
    contents = {open(f"{model}/model.bin", "rb").read() for model in models}
    assert len(contents) == 1


def test_fasttext_divergence_is_retried_then_a_clear_error(corpus, tmp_path):
    model = str(tmp_path / "model")
    with pytest.raises(ClassifierTrainingError, match=r"model: fastText diverged .* at lr=1000 and again at lr=250"):
        train_quality_classifier(classifier_config(corpus, model, learning_rate=1000.0, epochs=5))
    assert not (tmp_path / "model" / "model.bin").exists()


@pytest.mark.parametrize("shape", ["saturated", "bimodal", "uniform"])
def test_keep_fraction_is_met_whatever_the_score_distribution(shape):
    """85% of scores at 0.9995 made a 1,000-bin histogram's threshold 1.0, keeping nothing."""
    rng = np.random.default_rng(0)
    count = 30_000
    scores = {"saturated": np.where(rng.random(count) < 0.85, 0.9995, rng.random(count)),
              "bimodal": np.concatenate([rng.normal(0.02, 0.01, count // 2), rng.normal(0.98, 0.01, count // 2)]),
              "uniform": rng.random(count)}[shape].clip(0, 1).astype(np.float32)  # fmt: skip
    keys = score_keys(scores, [f"document {index}" for index in range(count)])
    shards = np.array_split(keys, 7)
    for fraction in (0.0, 0.05, 0.3, 0.5, 0.9, 1.0):
        threshold = top_fraction_threshold(lambda: iter(shards), fraction)
        assert abs(np.count_nonzero(keys >= threshold) / count - fraction) <= 0.005
        assert top_fraction_threshold(lambda: iter(shards[::-1]), fraction) == threshold


def test_an_unknown_label_is_refused_naming_the_models_labels(corpus, tmp_path):
    model = str(tmp_path / "model")
    train_quality_classifier(classifier_config(corpus, model, epochs=5))
    with pytest.raises(ValueError, match=r"__label__good.*__label__negative.*__label__positive"):
        fasttext_filter(FasttextFilterConfig(input_paths=[corpus], model_path=model, output_path=str(tmp_path / "out"),
                                             threshold=0.5, label="__label__good"))  # fmt: skip


def test_the_heldout_split_keeps_copies_of_a_text_on_one_side(corpus, tmp_path):
    """Split by id, exact copies landed on both sides and inflated held-out accuracy."""
    documents = rows(f"{corpus}/reference_pydoc.parquet")[:40]
    variants = [[document["text"], document["text"].replace(" ", "  ") + "\n"] for document in documents]
    copies = [
        {"id": f"{document['id']}-{number}", "text": text}
        for document, texts in zip(documents, variants, strict=True)
        for number, text in enumerate(texts)
    ]
    (tmp_path / "copies.jsonl").write_text("".join(json.dumps(copy) + "\n" for copy in copies))
    train, heldout = _split([str(tmp_path / "copies.jsonl")], 1000, 0.3, POSITIVE)
    assert len(train) + len(heldout) == 80 and heldout

    def texts(lines: list[str]) -> set[str]:
        return {" ".join(normalize(line.split(" ", 1)[1]).split()) for line in lines}

    assert not texts(train) & texts(heldout)


def test_decontamination_matches_short_eval_items_whole_and_counts_the_too_short(tmp_path):
    """An eval item shorter than n_grams words used to give no n-gram and was never matched."""
    (tmp_path / "eval").mkdir()
    items = ["The quick brown fox jumps over the lazy dog", "yes it is", "Paris"]
    (tmp_path / "eval" / "eval.jsonl").write_text("".join(json.dumps({"id": f"e{index}", "text": text}) + "\n"
                                                          for index, text in enumerate(items)))  # fmt: skip
    training = [{"id": "leaks", "text": "Typing test: the quick brown fox jumps over the lazy dog! Then more words."},
                {"id": "clean", "text": "A plain sentence that has nothing in common with the evaluation items."},
                {"id": "short", "text": "Is it? yes it is, said the tour guide in Paris."}]  # fmt: skip
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(document) + "\n" for document in training))
    output = str(tmp_path / "clean")
    decontaminate(DecontaminateConfig(input_paths=[str(tmp_path / "train.jsonl")], eval_paths=[str(tmp_path / "eval")],
                                      output_path=output))  # fmt: skip
    assert {row["id"] for row in rows(f"{output}/contaminated")} == {"leaks"}
    stats = stats_of(output)
    assert stats["eval_items"] == {"checked_by_ngrams": 0, "checked_whole": 1, "too_short": 2}


def test_decontamination_drops_documents_sharing_eval_ngrams(corpus, tmp_path):
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    docs = read_shard_table(f"{corpus}/reference_pydoc.parquet").to_pylist()
    leaked = docs[:3]
    (eval_dir / "eval.jsonl").write_text("".join(json.dumps({"id": f"eval-{i}", "text": d["text"][:2000]}) + "\n"
                                                 for i, d in enumerate(leaked)))  # fmt: skip
    output = str(tmp_path / "clean")
    decontaminate(DecontaminateConfig(input_paths=[corpus], eval_paths=[str(eval_dir)], output_path=output,
                                      raw_input=True))  # fmt: skip
    contaminated = {row["id"] for row in rows(f"{output}/contaminated")}
    assert {doc["id"] for doc in leaked} <= contaminated
    assert stats_of(output)["dropped"]["contaminated"] == len(contaminated) < 10
