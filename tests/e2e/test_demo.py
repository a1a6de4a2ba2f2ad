"""The demo's steps on small real data (this interpreter's stdlib), and the demo DAG end to end."""

from __future__ import annotations

import ast
import json
import platform
import sysconfig
import tokenize
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from executor import Executor, StepStatus, read_status
from executor.store.events import read_events
from experiments.demo import build_steps
from steps.corpora.text_corpus import EXCLUDED_DIRS, TextCorpusConfig, build_text_corpus, stdlib_files
from steps.data.jsonl_shards import list_shards, read_records
from steps.tokenize.corpus_stats import CorpusStatsConfig, compute_corpus_stats
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, train_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def build_corpus(output_path: Path, source: str, max_docs: int, docs_per_shard: int = 4) -> str:
    config = TextCorpusConfig(
        source=source,
        max_docs=max_docs,
        docs_per_shard=docs_per_shard,
        python_version=platform.python_version(),
        output_path=str(output_path),
    )
    build_text_corpus(config)
    return config.output_path


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("corpora")
    return [
        build_corpus(root / "code", "python_stdlib", max_docs=15),
        build_corpus(root / "prose", "python_docstrings", max_docs=10),
    ]


@pytest.fixture(scope="module")
def tokenizer_path(corpora: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    output_path = str(tmp_path_factory.mktemp("tokenizer"))
    train_tokenizer(TrainTokenizerConfig(input_paths=corpora, vocab_size=500, output_path=output_path))
    return output_path


def test_stdlib_files_are_sorted_python_sources_outside_excluded_dirs() -> None:
    files = stdlib_files(STDLIB)
    assert files == sorted(files)
    assert len(files) > 100
    assert all(name.endswith(".py") for name in files)
    assert not any(set(name.split("/")[:-1]) & EXCLUDED_DIRS for name in files)


def test_stdlib_corpus_holds_the_first_files_verbatim(tmp_path: Path) -> None:
    output_path = build_corpus(tmp_path, "python_stdlib", max_docs=10, docs_per_shard=4)

    expected = stdlib_files(STDLIB)[:10]
    records = list(read_records(output_path))
    assert [record["id"] for record in records] == [f"python_stdlib/{name}" for name in expected]
    assert {record["source"] for record in records} == {"python_stdlib"}
    for record, name in zip(records, expected, strict=True):
        with tokenize.open(STDLIB / name) as handle:
            assert record["text"] == handle.read()
    assert [Path(path).name for path in list_shards(output_path)] == [
        "shard-00000.jsonl.gz",
        "shard-00001.jsonl.gz",
        "shard-00002.jsonl.gz",
    ]
    stats = read_json(tmp_path / "stats.json")
    assert stats["docs"] == 10
    assert stats["shards"] == 3
    assert stats["bytes"] == sum(len(record["text"].encode()) for record in records)


def test_docstring_corpus_starts_each_document_with_its_module_docstring(tmp_path: Path) -> None:
    output_path = build_corpus(tmp_path, "python_docstrings", max_docs=5)

    records = list(read_records(output_path))
    assert len(records) == 5
    assert [record["id"] for record in records] == sorted(record["id"] for record in records)
    for record in records:
        module = STDLIB / record["id"].removeprefix("python_docstrings/")
        with tokenize.open(module) as handle:
            module_doc = ast.get_docstring(ast.parse(handle.read()))
        assert module_doc is not None and len(module_doc) >= 200
        assert record["text"].startswith(module_doc)
    assert read_json(tmp_path / "stats.json")["docs"] == 5


def test_rebuilt_corpus_is_byte_identical(tmp_path: Path) -> None:
    first = build_corpus(tmp_path / "first", "python_docstrings", max_docs=6)
    second = build_corpus(tmp_path / "second", "python_docstrings", max_docs=6)

    first_shards, second_shards = list_shards(first), list_shards(second)
    assert len(first_shards) == len(second_shards) == 2
    for a, b in zip(first_shards, second_shards, strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"source": "wikipedia"}, "unknown source"),
        ({"max_docs": 0}, "max_docs"),
        ({"docs_per_shard": 0}, "docs_per_shard"),
        ({"python_version": "2.7.18"}, "Python 2.7.18"),
    ],
)
def test_corpus_rejects_bad_config(tmp_path: Path, change: dict, message: str) -> None:
    settings = {"source": "python_stdlib", "max_docs": 3, "output_path": str(tmp_path)} | change
    with pytest.raises(ValueError, match=message):
        build_text_corpus(TextCorpusConfig(**settings))
    assert not list(tmp_path.iterdir())


def test_tokenizer_loads_round_trips_and_counts_tokens(corpora: list[str], tokenizer_path: str) -> None:
    tokenizer = Tokenizer.from_file(str(Path(tokenizer_path) / "tokenizer.json"))
    assert 256 < tokenizer.get_vocab_size() <= 500
    for text in ["def f(x):\n    return x  # naïve café, 日本語\n", "\t\n  trailing  ", "<|endoftext|>"]:
        assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text
    assert tokenizer.encode("<|endoftext|>").tokens == ["<|endoftext|>"]

    texts = [record["text"] for path in corpora for record in read_records(path)]
    tokens = sum(len(encoding.ids) for encoding in tokenizer.encode_batch(texts))
    stats = read_json(Path(tokenizer_path) / "stats.json")
    assert stats["vocab_size"] == tokenizer.get_vocab_size()
    assert stats["docs"] == len(texts) == 25
    assert stats["bytes"] == sum(len(text.encode()) for text in texts)
    assert stats["tokens"] == tokens
    assert stats["tokens_per_byte"] == pytest.approx(tokens / stats["bytes"])
    assert 0 < stats["tokens_per_byte"] < 1
    assert stats["round_trip_failures"] == 0


def test_corpus_stats_agree_with_each_corpus(corpora: list[str], tokenizer_path: str, tmp_path: Path) -> None:
    compute_corpus_stats(
        CorpusStatsConfig(input_paths=corpora, tokenizer_path=tokenizer_path, top_words=20, output_path=str(tmp_path))
    )

    stats = read_json(tmp_path / "stats.json")
    assert [described["input_path"] for described in stats["inputs"]] == corpora
    for described, corpus in zip(stats["inputs"], corpora, strict=True):
        corpus_stats = read_json(Path(corpus) / "stats.json")
        texts = [record["text"] for record in read_records(corpus)]
        assert described["docs"] == corpus_stats["docs"] == len(texts)
        assert described["bytes"] == corpus_stats["bytes"]
        assert described["sources"] == {corpus_stats["source"]: corpus_stats["docs"]}
        assert described["whitespace_tokens"] == sum(len(text.split()) for text in texts)
        assert described["tokens_per_byte"] == pytest.approx(described["tokens"] / described["bytes"])
        counts = [count for _word, count in described["top_words"]]
        assert len(counts) == 20 and counts == sorted(counts, reverse=True)
    for key in ("docs", "bytes", "whitespace_tokens", "tokens"):
        assert stats[key] == sum(described[key] for described in stats["inputs"])
    assert stats["tokens"] == read_json(Path(tokenizer_path) / "stats.json")["tokens"]
    prose_words = {word for word, _count in stats["inputs"][1]["top_words"]}
    assert {"the", "a"} <= prose_words


def test_demo_dag_runs_each_step_once_then_skips_all(tmp_path: Path) -> None:
    steps = build_steps(max_docs=12, vocab_size=400)
    code, prose, tokenizer, stats = steps

    first = Executor(str(tmp_path))
    first.run(steps)
    paths = [first.output_paths[step] for step in steps]
    assert all(path.startswith(str(tmp_path)) for path in paths)
    assert [read_status(path) for path in paths] == [StepStatus.SUCCESS] * 4
    assert first.configs[tokenizer].input_paths == [first.output_paths[code], first.output_paths[prose]]
    assert first.configs[stats].tokenizer_path == first.output_paths[tokenizer]
    assert read_json(Path(first.output_paths[stats]) / "stats.json")["docs"] == 24

    second = Executor(str(tmp_path))
    second.run(build_steps(max_docs=12, vocab_size=400))
    assert [decision.action for decision in second.decisions] == ["skip"] * 4
    for path in paths:
        statuses = [event.status for event in read_events(path)]
        assert statuses.count(StepStatus.RUNNING) == 1, path
        assert statuses[-1] == StepStatus.SUCCESS


def test_demo_dag_paths_follow_versioned_values_only(tmp_path: Path) -> None:
    base_steps = build_steps(max_docs=3, vocab_size=300)
    base = Executor(str(tmp_path))
    base.run(base_steps, dry_run=True)
    bigger_vocab_steps = build_steps(max_docs=3, vocab_size=320)
    bigger_vocab = Executor(str(tmp_path))
    bigger_vocab.run(bigger_vocab_steps, dry_run=True)

    before = [base.output_paths[step] for step in base_steps]
    after = [bigger_vocab.output_paths[step] for step in bigger_vocab_steps]
    assert before[:2] == after[:2]  # the corpora do not depend on the vocabulary
    assert before[2] != after[2] and before[3] != after[3]
    assert not list(tmp_path.iterdir())
