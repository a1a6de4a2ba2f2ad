"""The cells step on real offline text: topics that separate the domains, every document in exactly one
cell, token counts that add up to the raw tokenizer's, and empty cells counted rather than fatal."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
from mixing_fixtures import write_hf_tokenizer

from executor.shards.writer import read_shard_markers
from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus
from steps.data.documents import ReadReport, list_input_files, read_documents
from steps.filter.fasttext_quality import TrainClassifierConfig, train_quality_classifier
from steps.tokenize.cells import CellsConfig, build_cells, cell_names
from steps.tokenize.train_tokenizer import load_tokenizer

DOMAINS = ("prose_kjv", "code_stdlib", "reference_pydoc")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("corpus"))
    build_real_corpus(RealCorpusConfig(output_path=path, docs_per_domain=60, exact_copies=0, near_copies=0,
                                       near_levels=[]))  # fmt: skip
    return f"{path}/raw"


def documents(paths: list[str]) -> list[dict]:
    return [document for path in list_input_files(paths) for document in read_documents(path, ReadReport(), False)]


@pytest.fixture(scope="module")
def inputs(corpus) -> list[str]:
    return [path for path in list_input_files(corpus) if Path(path).name.split(".")[0] in DOMAINS]


@pytest.fixture(scope="module")
def tokenizer(inputs, tmp_path_factory) -> str:
    return write_hf_tokenizer(tmp_path_factory.mktemp("tokenizer"), [doc["text"] for doc in documents(inputs)])


@pytest.fixture(scope="module")
def quality_model(corpus, tmp_path_factory) -> str:
    output = str(tmp_path_factory.mktemp("quality"))
    train_quality_classifier(TrainClassifierConfig(positive_paths=[f"{corpus}/reference_pydoc.parquet"],
                                                   negative_paths=[f"{corpus}/prose_kjv.jsonl.gz"], output_path=output,
                                                   dim=16, bucket=20_000, epochs=20))  # fmt: skip
    return output


def cell_ids(output: str) -> dict[str, list[str]]:
    cells = {}
    for folder in sorted(Path(output, "cells").iterdir()):
        cells[folder.name] = [doc["id"] for doc in documents([str(folder)])]
    return cells


@pytest.mark.slow
def test_every_document_lands_in_exactly_one_cell_and_tokens_add_up(inputs, tokenizer, quality_model, tmp_path):
    output = str(tmp_path / "cells")
    config = CellsConfig(input_paths=inputs, tokenizer_path=tokenizer, output_path=output,
                         quality_model_path=quality_model, topics=3, quality_buckets=2, sample_docs=120,
                         vocab_size=2000, embedding_dim=16)  # fmt: skip
    build_cells(config)
    originals = documents(inputs)
    cells = cell_ids(output)
    placed = collections.Counter(doc_id for ids in cells.values() for doc_id in ids)
    assert placed == collections.Counter(doc["id"] for doc in originals)
    assert set(cells) == set(cell_names(3, 2))

    composition = json.loads(Path(output, "composition.json").read_text())
    raw = load_tokenizer(tokenizer).encode_batch_fast([doc["text"] for doc in originals], add_special_tokens=False)
    assert composition["tokens"] == sum(len(encoding.ids) for encoding in raw)
    assert sum(cell["tokens"] for cell in composition["cells"].values()) == composition["tokens"]
    assert composition["docs"] == len(originals)
    assert sum(cell["share"] for cell in composition["cells"].values()) == pytest.approx(1.0)
    for name, cell in composition["cells"].items():
        assert cell["docs"] == len(cells[name])
        assert len(cell["samples"]) == min(3, cell["docs"])
        assert len(cell["top_terms"]) == 8
    # The topics are learned from the text alone, yet they recover the three domains.
    topic_of = {doc_id: composition["cells"][name]["topic"] for name, ids in cells.items() for doc_id in ids}
    majority = {}
    for domain in DOMAINS:
        topics = collections.Counter(topic_of[doc["id"]] for doc in originals if doc["source"] == domain)
        topic, count = topics.most_common(1)[0]
        assert count >= 0.8 * sum(topics.values()), (domain, topics)
        majority[domain] = topic
    assert len(set(majority.values())) == 3
    # The two quality buckets split the classifier's scores at the sample median: both are used.
    buckets = collections.Counter(
        cell["quality_bucket"] for cell in composition["cells"].values() for _ in range(cell["docs"])
    )
    assert min(buckets[0], buckets[1]) >= 0.25 * len(originals)

    build_cells(config)  # a rerun commits nothing new and rewrites the same composition
    assert json.loads(Path(output, "composition.json").read_text()) == composition
    assert all(marker["attempts"] == 1 for marker in read_shard_markers(output).values())


def test_cells_without_documents_are_counted_and_reported(tokenizer, tmp_path):
    texts = ["In the beginning God created the heaven and the earth and the light",
             "def main(argv): return parse(argv) and run(argv) or exit(argv)",
             "The import statement finds a module and binds a name in the local namespace"]  # fmt: skip
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i}", "text": texts[i % 3]}) + "\n" for i in range(30)))
    output = str(tmp_path / "cells")
    build_cells(CellsConfig(input_paths=[str(source)], tokenizer_path=tokenizer, output_path=output, topics=5,
                            quality_buckets=1, sample_docs=30, embedding_dim=4))  # fmt: skip
    composition = json.loads(Path(output, "composition.json").read_text())
    empty = [name for name, cell in composition["cells"].items() if cell["docs"] == 0]
    assert len(empty) >= 2  # three distinct texts cannot fill five clusters
    assert composition["empty_cells"] == empty
    assert json.loads(Path(output, "stats.json").read_text())["empty_cells"] == len(empty)
    cells = cell_ids(output)
    assert all(cells[name] == [] for name in empty)
    assert sum(len(ids) for ids in cells.values()) == 30


def test_bad_config_names_the_step(tokenizer, tmp_path):
    output = str(tmp_path / "cells-deadbeef")
    with pytest.raises(ValueError, match=r"cells step at .*cells-deadbeef.*quality_model_path"):
        build_cells(CellsConfig(input_paths=[str(tmp_path)], tokenizer_path=tokenizer, output_path=output))
