"""The tokenize step against real Levanter: its caches decode back to the documents, hold exactly the raw
tokenizer's tokens, carry the ledger Levanter's own consolidation would write, resume group by group after a
SIGKILL, and refuse bad input with errors that name the step."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from levanter.store.cache import CacheLedger, consolidate_shard_cache_ledgers
from tokenizers import Encoding, Tokenizer

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, StepFailedError
from executor.shards.writer import read_shard_markers
from steps.corpora.text_corpus import TextCorpusConfig, build_text_corpus
from steps.data.documents import ReadReport, list_input_files, read_documents, table_bytes, to_table
from steps.tokenize import tokenize as tokenize_module
from steps.tokenize.levanter_cache import UnsupportedCachePathError, load_cache
from steps.tokenize.tokenize import (
    ENCODE_AHEAD,
    EmptyTokenizeOutputError,
    TokenizeConfig,
    _encoded_batches,
    in_validation,
    load_components,
    tokenize,
)
from steps.tokenize.train_tokenizer import (
    ExistingTokenizer,
    TrainTokenizerConfig,
    existing_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

VALIDATION_FRACTION = 0.2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Real text: 40 stdlib modules and 20 docstring documents, in six JSONL.gz shards."""
    root = tmp_path_factory.mktemp("corpus")
    for source, docs in (("python_stdlib", 40), ("python_docstrings", 20)):
        build_text_corpus(
            TextCorpusConfig(source=source, max_docs=docs, docs_per_shard=10, output_path=str(root / source))
        )
    return str(root)


def document_files(corpus: str) -> list[str]:
    return [f"{corpus}/python_stdlib/shard-*.jsonl.gz", f"{corpus}/python_docstrings/shard-*.jsonl.gz"]


@pytest.fixture(scope="module")
def tokenizer_path(corpus: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    output_path = str(tmp_path_factory.mktemp("tokenizer"))
    inputs = [f"{corpus}/python_stdlib", f"{corpus}/python_docstrings"]
    train_tokenizer(
        TrainTokenizerConfig(input_paths=inputs, vocab_size=600, sample_bytes=400_000, output_path=output_path)
    )
    return output_path


@pytest.fixture(scope="module")
def tokenized(corpus: str, tokenizer_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    output_path = str(tmp_path_factory.mktemp("tokenized"))
    tokenize(
        TokenizeConfig(
            input_paths=document_files(corpus),
            tokenizer_path=tokenizer_path,
            validation_fraction=VALIDATION_FRACTION,
            output_path=output_path,
            batch_size=7,
            parallelism="thread",
            group_bytes=0,  # one group per file: six parts for Levanter's consolidation to compare with
        )
    )
    return output_path


def documents_of(input_paths: list[str]) -> list[dict]:
    return [document for path in list_input_files(input_paths) for document in read_documents(path, ReadReport())]


def rows(split_path: str) -> list[np.ndarray]:
    cache = load_cache(split_path)
    return [row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))]


def test_cache_decodes_back_to_every_document_with_the_raw_tokenizers_counts(corpus, tokenizer_path, tokenized):
    tokenizer = load_tokenizer(tokenizer_path)
    eos = tokenizer.token_to_id("<|endoftext|>")
    documents = documents_of(document_files(corpus))
    expected: dict[str, list[dict]] = {"train": [], "validation": []}
    for document in documents:
        expected["validation" if in_validation(document["id"], VALIDATION_FRACTION) else "train"].append(document)
    assert expected["train"] and expected["validation"]

    stats = json.loads(Path(tokenized, "stats.json").read_text())
    total_tokens = 0
    for split, split_documents in expected.items():
        cached = rows(f"{tokenized}/{split}")
        assert len(cached) == len(split_documents)
        raw = tokenizer.encode_batch([document["text"] for document in split_documents], add_special_tokens=False)
        for row, document, encoding in zip(cached, split_documents, raw, strict=True):
            assert row.dtype == np.int32 and row[-1] == eos and eos not in row[:-1]
            assert row[:-1].tolist() == encoding.ids
            assert tokenizer.decode(row[:-1].tolist(), skip_special_tokens=False) == document["text"]
        split_tokens = sum(len(encoding.ids) + 1 for encoding in raw)
        assert stats["splits"][split] == {"documents": len(split_documents), "tokens": split_tokens}
        total_tokens += split_tokens
    text_bytes = sum(len(document["text"].encode()) for document in documents)
    assert (stats["documents"], stats["tokens"], stats["bytes"]) == (len(documents), total_tokens, text_bytes)
    assert stats["bytes_per_token"] == pytest.approx(text_bytes / total_tokens)
    assert set(stats["sources"]) == {"python_stdlib", "python_docstrings"}
    assert sum(source["tokens"] for source in stats["sources"].values()) == total_tokens
    assert stats["sources"]["python_docstrings"]["documents"] == 20
    assert stats["empty_files"] == 0 and stats["bad_input"] == {}


def test_ledger_equals_what_levanters_consolidation_writes(tokenized, tmp_path):
    ours = CacheLedger.load(f"{tokenized}/train")
    copy = tmp_path / "train"
    shutil.copytree(f"{tokenized}/train", copy)
    (copy / "shard_ledger.json").unlink()
    parts = sorted(str(path) for path in copy.glob("part-*"))
    theirs = consolidate_shard_cache_ledgers(
        parts, str(copy), {"input_ids": np.zeros((0,), dtype=np.int32)}, ours.metadata
    )
    assert len(parts) == 6
    assert ours.layout == theirs.layout == "sharded"
    for field in ("total_num_rows", "shard_rows", "finished_shards", "field_counts", "field_counts_by_shard"):
        assert getattr(ours, field) == getattr(theirs, field), field


def test_train_tokenizer_writes_a_directory_levanter_and_transformers_load_offline(tokenizer_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from levanter.tokenizers import load_tokenizer as levanter_tokenizer
    from transformers import AutoTokenizer

    ours = load_tokenizer(tokenizer_path)
    text = "def f(x):\n    return x  # naïve café, 日本語\n"
    for loaded in (levanter_tokenizer(tokenizer_path), AutoTokenizer.from_pretrained(tokenizer_path)):
        assert loaded.eos_token == "<|endoftext|>" and loaded.eos_token_id == ours.token_to_id("<|endoftext|>")
        assert loaded.bos_token is None
        assert loaded.encode(text, add_special_tokens=False) == ours.encode(text, add_special_tokens=False).ids
        assert loaded.decode(ours.encode(text).ids) == text


def pinned_tokenizer_step(pinned: ExistingTokenizer) -> ExecutorStep:
    config = TrainTokenizerConfig(input_paths=[], existing=pinned, output_path=THIS_OUTPUT_PATH)
    return ExecutorStep(name="tokenizer/pinned", fn=train_tokenizer, config=config)


def test_an_existing_tokenizer_is_pinned_by_the_hashes_of_its_files(tokenizer_path, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(tokenizer_path, name), local / name)
    executor = Executor(str(tmp_path / "prefix"))
    step = pinned_tokenizer_step(existing_tokenizer(str(local)))
    executor.run([step])
    output = Path(executor.output_paths[step])
    assert (output / "tokenizer.json").read_bytes() == (local / "tokenizer.json").read_bytes()

    moved = tmp_path / "moved"
    local.rename(moved)
    executor.run([pinned_tokenizer_step(existing_tokenizer(str(moved)))], dry_run=True)
    assert set(executor.output_paths.values()) == {str(output)}, "moving the folder changed the hash"
    config = json.loads((moved / "tokenizer_config.json").read_text())
    (moved / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 2048}))
    edited = pinned_tokenizer_step(existing_tokenizer(str(moved)))
    executor.run([edited], dry_run=True)
    assert executor.output_paths[edited] != str(output), "an edited file kept the hash"

    (moved / "tokenizer.json").write_text((moved / "tokenizer.json").read_text().replace("<|endoftext|>", "<|eot|>"))
    with pytest.raises(StepFailedError, match=r"tokenizer\.json changed since the DAG was built"):
        executor.run([edited])


def jsonl_inputs(folder: Path, files: dict[str, list[dict]]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for name, records in files.items():
        (folder / name).write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(folder)


def test_encode_batches_end_at_either_cap_and_come_back_in_order(tokenizer_path):
    """The step encodes a batch ahead in a helper thread: batches must come back in reading order, each
    with its own encodings, and end at `batch_size` documents or once `batch_chars` characters are held."""
    texts = ["a" * 30, "b", "c", "d", "e" * 25, "f", "g" * 100, "h"]
    documents = [{"id": str(index), "text": text} for index, text in enumerate(texts)]
    tokenizer = load_tokenizer(tokenizer_path)
    batches = list(_encoded_batches(tokenizer, iter(documents), 3, 30))
    assert [[document["text"][0] for document in batch] for batch, _ in batches] == [
        ["a"], ["b", "c", "d"], ["e", "f", "g"], ["h"]
    ]  # fmt: skip
    for batch, encodings in batches:
        assert [encoding.ids for encoding in encodings] == [
            encoding.ids for encoding in tokenizer.encode_batch([d["text"] for d in batch], add_special_tokens=False)
        ]


class _RendezvousTokenizer:
    """The real tokenizer, whose first `ENCODE_AHEAD` encode calls wait for one another: they return only if
    that many batches are encoding at once (a pipeline one batch deep breaks the barrier instead)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._barrier = threading.Barrier(ENCODE_AHEAD, timeout=60)  # a deadlock guard, not a timing
        self.calls = 0

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> list[Encoding]:
        self.calls += 1
        if self.calls <= ENCODE_AHEAD:
            self._barrier.wait()
        return self._tokenizer.encode_batch_fast(texts, add_special_tokens=add_special_tokens)


def test_a_group_keeps_several_batches_encoding_at_once(tokenizer_path):
    """At a group's end, and while its neighbour commits, the encoding threads have only this group's batches
    to work on: `ENCODE_AHEAD` of them are encoding while the caller frames and writes the one before."""
    assert ENCODE_AHEAD >= 2
    documents = [{"id": str(index), "text": f"document {index} " * 20} for index in range(12)]
    tokenizer = load_tokenizer(tokenizer_path)
    rendezvous = _RendezvousTokenizer(tokenizer)
    batches = list(_encoded_batches(rendezvous, iter(documents), 2, 1 << 20))  # type: ignore[arg-type]
    assert rendezvous.calls == 6
    assert [[document["id"] for document in batch] for batch, _ in batches] == [
        [str(index), str(index + 1)] for index in range(0, 12, 2)
    ]
    for batch, encodings in batches:
        expected = tokenizer.encode_batch_fast([d["text"] for d in batch], add_special_tokens=False)
        assert [encoding.ids for encoding in encodings] == [encoding.ids for encoding in expected]


class _PoolWatchingTokenizer:
    """The real tokenizer, noting for each encode call its thread and what TOKENIZERS_PARALLELISM said."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self.calls: list[tuple[str, str | None]] = []

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> list[Encoding]:
        self.calls.append((threading.current_thread().name, os.environ.get("TOKENIZERS_PARALLELISM")))
        return self._tokenizer.encode_batch_fast(texts, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("setting", [None, "true"])
def test_batches_encode_in_the_steps_threads_with_the_tokenizers_pool_off_and_the_setting_comes_back(
    tokenizer_path, monkeypatch, setting
):
    """Each batch encodes in one of the step's encoding threads with `tokenizers`' own pool off (it reads
    TOKENIZERS_PARALLELISM at every call), so that batches end in the order they started instead of all
    together at a group's end; once the group is done the variable is as it was, unset or set."""
    if setting is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", setting)
    documents = [{"id": str(index), "text": f"document {index} " * 20} for index in range(9)]
    watching = _PoolWatchingTokenizer(load_tokenizer(tokenizer_path))
    batches = list(_encoded_batches(watching, iter(documents), 2, 1 << 20))  # type: ignore[arg-type]
    assert [document["id"] for batch, _ in batches for document in batch] == [str(index) for index in range(9)]
    assert len(watching.calls) == 5
    assert all(name.startswith("encode") and value == "false" for name, value in watching.calls), watching.calls
    assert os.environ.get("TOKENIZERS_PARALLELISM") == setting


def test_the_tokenizers_pool_stays_off_until_the_last_group_of_the_process_ends(tokenizer_path, monkeypatch):
    """Groups of one process overlap (threads): the first to start turns the pool off, the last to end puts the
    setting back, and one ending meanwhile leaves it off for the other."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    tokenizer = load_tokenizer(tokenizer_path)
    documents = [{"id": str(index), "text": f"document {index}"} for index in range(4)]
    first = _encoded_batches(tokenizer, iter(documents), 2, 1 << 20)
    second = _encoded_batches(tokenizer, iter(documents), 2, 1 << 20)
    next(first), next(second)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert len(list(first)) == 1 and os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert len(list(second)) == 1 and os.environ["TOKENIZERS_PARALLELISM"] == "true"


def _encode_in_child(tokenizer_path: str, results) -> None:
    documents = [{"id": str(index), "text": f"document {index}"} for index in range(5)]
    batches = _encoded_batches(load_tokenizer(tokenizer_path), iter(documents), 2, 1 << 20)
    results.put([len(encodings) for _, encodings in batches])


def test_a_forked_child_encodes_with_threads_of_its_own(tokenizer_path):
    """The encoding threads are the process's: a child forked after they started (their objects copied, the
    threads not) starts its own instead of queueing batches for threads it does not have."""
    threads = tokenize_module.ENCODE_THREADS
    everyone = threading.Barrier(threads, timeout=60)  # every encoding thread started, then the fork
    for waiting in [tokenize_module._encoders().submit(everyone.wait) for _ in range(threads)]:
        waiting.result()
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_encode_in_child, args=(tokenizer_path, results))
    child.start()
    child.join(timeout=60)  # a deadlock guard, not a timing
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child never got its batches encoded")
    assert child.exitcode == 0 and results.get(timeout=5) == [2, 2, 1]


class _HandOverTokenizer:
    """The real tokenizer, whose encode call of file a's last batch waits (up to a deadlock guard) for file b's
    first encode call, noting whether a's group had committed by then."""

    def __init__(self, tokenizer: Tokenizer, output: Path):
        self._tokenizer = tokenizer
        self._output = output
        self._b_started = threading.Event()
        self.b_waited_for = False
        self.markers_when_b_started: set[str] | None = None

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> list[Encoding]:
        if texts[0].startswith("b ") and not self._b_started.is_set():
            self.markers_when_b_started = set(read_shard_markers(str(self._output)))
            self._b_started.set()
        if texts[-1].startswith("a last"):
            self.b_waited_for = self._b_started.wait(timeout=30)  # a deadlock guard, not a timing
        return self._tokenizer.encode_batch_fast(texts, add_special_tokens=add_special_tokens)


def test_the_next_group_encodes_while_the_last_one_finishes_and_commits(tmp_path, tokenizer_path, monkeypatch):
    """With groups in threads, one reading slot per worker: a group gives its slot back once its last batch is
    submitted, so the next group's batches reach the tokenizer before this one's last batch is encoded and
    long before it commits; the cache is the same as ever. Before, one worker ran a group from read to commit."""
    a_docs = [{"id": f"a{i}", "text": f"a document {i} " * 5} for i in range(5)]
    b_docs = [{"id": f"b{i}", "text": f"b document {i} " * 5} for i in range(6)]
    inputs = jsonl_inputs(
        tmp_path / "in", {"a.jsonl": [*a_docs, {"id": "a5", "text": "a last one"}], "b.jsonl": b_docs}
    )
    output = tmp_path / "out"
    real = load_tokenizer(tokenizer_path)
    hand_over = _HandOverTokenizer(real, output)
    special = tokenize_module._framing(tokenizer_path)[1]
    monkeypatch.setattr(tokenize_module, "_framing", lambda path: (hand_over, special))
    tokenize(TokenizeConfig(input_paths=[inputs], tokenizer_path=tokenizer_path, output_path=str(output),
                            validation_fraction=0.0, batch_size=2, parallelism="thread", max_workers=1,
                            group_bytes=0))  # fmt: skip
    assert hand_over.b_waited_for and hand_over.markers_when_b_started == set()
    texts = [d["text"] for d in [*a_docs, {"text": "a last one"}, *b_docs]]
    bos = [] if special.bos is None else [special.bos]
    expected = [[*bos, *encoding.ids, special.eos] for encoding in real.encode_batch_fast(texts, False)]
    assert [row.tolist() for row in rows(str(output / "train"))] == expected


def test_documents_without_text_and_empty_files_are_counted_and_reported(tmp_path, tokenizer_path):
    good = [{"id": f"d{i}", "text": f"document number {i}\n", "source": "s"} for i in range(3)]
    inputs = jsonl_inputs(tmp_path / "in", {"a.jsonl": [*good, {"id": "no-text", "source": "s"}], "b.jsonl": []})
    output = tmp_path / "out"
    tokenize(
        TokenizeConfig(
            input_paths=[inputs],
            tokenizer_path=tokenizer_path,
            parallelism="thread",
            output_path=str(output),
            validation_fraction=0.0,
            raw_input=False,
        )
    )
    stats = json.loads((output / "stats.json").read_text())
    assert stats["documents"] == 3 and stats["empty_files"] == 1
    assert stats["bad_input"] == {"missing_text": 1}
    assert stats["bad_samples"][0]["file"].endswith("a.jsonl") and stats["bad_samples"][0]["line"] == 4
    assert len(rows(str(output / "train"))) == 3
    assert len(rows(str(output / "validation"))) == 0


def test_an_empty_raw_file_fails_the_step_naming_it_and_leaves_no_cache(tmp_path, tokenizer_path):
    inputs = jsonl_inputs(tmp_path / "in", {"a.jsonl": [{"id": "d", "text": "some text"}], "empty.jsonl": []})
    step = ExecutorStep(
        name="tokenized/bad",
        fn=tokenize,
        config=TokenizeConfig(
            input_paths=[inputs], tokenizer_path=tokenizer_path, parallelism="thread", output_path=THIS_OUTPUT_PATH
        ),
    )
    executor = Executor(str(tmp_path / "prefix"))
    with pytest.raises(StepFailedError, match=r"tokenized/bad.*empty\.jsonl has no usable document"):
        executor.run([step])
    assert not Path(executor.output_paths[step], "train", "shard_ledger.json").exists()


def test_inputs_without_any_usable_document_leave_no_cache(tmp_path, tokenizer_path):
    inputs = jsonl_inputs(tmp_path / "in", {"a.jsonl": [{"id": "x"}, {"id": "y", "text": "   "}]})
    output = tmp_path / "out"
    config = TokenizeConfig(
        input_paths=[inputs],
        tokenizer_path=tokenizer_path,
        parallelism="thread",
        output_path=str(output),
        raw_input=False,
    )
    with pytest.raises(EmptyTokenizeOutputError, match=r"tokenize .*out.*no training document.*missing_text"):
        tokenize(config)
    assert not (output / "train" / "shard_ledger.json").exists()


def test_a_memory_prefix_is_refused_before_any_work(tokenizer_path):
    config = TokenizeConfig(input_paths=["memory://in"], tokenizer_path=tokenizer_path, output_path="memory://out")
    with pytest.raises(UnsupportedCachePathError, match=r"tokenize \(memory://out\).*tensorstore.*gs://"):
        tokenize(config)


KILLED_RUNNER = textwrap.dedent("""
    import sys
    from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep
    from steps.tokenize.tokenize import TokenizeConfig, tokenize

    prefix, inputs, tokenizer_path = sys.argv[1:4]
    config = TokenizeConfig(input_paths=[inputs], tokenizer_path=tokenizer_path, output_path=THIS_OUTPUT_PATH,
                            validation_fraction=0.2, parallelism="thread", max_workers=1, group_bytes=0)
    Executor(prefix).run([ExecutorStep(name="tokenized/killed", fn=tokenize, config=config)])
""")


def many_small_inputs(folder: Path, corpus: str, files: int) -> str:
    documents = documents_of(document_files(corpus))
    return jsonl_inputs(folder, {f"part-{index:03d}.jsonl": documents[index::files] for index in range(files)})


@pytest.mark.slow
def test_sigkill_mid_way_then_rerun_redoes_only_unfinished_groups(tmp_path, corpus, tokenizer_path, fast_leases):
    inputs = many_small_inputs(tmp_path / "in", corpus, files=30)
    prefix = tmp_path / "prefix"
    env = {**os.environ, "EXECUTOR_LEASE_HEARTBEAT_S": "0.1", "EXECUTOR_LEASE_STALE_S": "1.0"}
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUNNER, str(prefix), inputs, tokenizer_path],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while len(list(prefix.glob("tokenized/killed-*/.executor_shards/*.json"))) < 3:
        assert process.poll() is None and time.monotonic() < deadline, "the runner ended before committing 3 groups"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    (output,) = prefix.glob("tokenized/killed-*")
    before = read_shard_markers(str(output))
    assert 3 <= len(before) < 30, "the kill must land mid-way"
    assert not (output / "train" / "shard_ledger.json").exists()

    config = TokenizeConfig(
        input_paths=[inputs],
        tokenizer_path=tokenizer_path,
        output_path=THIS_OUTPUT_PATH,
        validation_fraction=0.2,
        parallelism="thread",
        max_workers=1,
        group_bytes=0,
    )
    Executor(str(prefix)).run([ExecutorStep(name="tokenized/killed", fn=tokenize, config=config)])
    after = read_shard_markers(str(output))
    assert len(after) == 30
    assert {shard_id: after[shard_id] for shard_id in before} == before, "a committed group ran again"
    rerun_workers = {after[shard_id]["worker"] for shard_id in set(after) - set(before)}
    assert rerun_workers == {f"{os.uname().nodename}:{os.getpid()}"}

    reference = tmp_path / "reference"
    tokenize(
        TokenizeConfig(
            input_paths=[inputs],
            tokenizer_path=tokenizer_path,
            parallelism="thread",
            output_path=str(reference),
            validation_fraction=0.2,
        )
    )
    for split in ("train", "validation"):
        resumed, uninterrupted = rows(str(output / split)), rows(str(reference / split))
        assert [row.tolist() for row in resumed] == [row.tolist() for row in uninterrupted]


def test_per_folder_gives_each_cell_its_own_caches_and_lists_the_usable_ones(corpus, tokenizer_path, tmp_path):
    """A cells step's layout (`cells/<cell>/<file>`): one step, one pair of caches per cell; a cell whose documents
    all fall in the training split is listed as `train_only`: a train step trains on it (Levanter's mixture has it,
    weighted) and evaluates it nowhere (no validation set), so its data is not lost from the mixture."""
    cells = tmp_path / "cells"
    layout = {"code": sorted(Path(corpus, "python_stdlib").glob("shard-*.jsonl.gz")),
              "prose": sorted(Path(corpus, "python_docstrings").glob("shard-*.jsonl.gz"))}  # fmt: skip
    for cell, files in layout.items():
        (cells / cell).mkdir(parents=True)
        for file in files:
            shutil.copy(file, cells / cell / file.name)
    training_only = next(doc for doc in documents_of(document_files(corpus))
                         if not in_validation(doc["id"], VALIDATION_FRACTION))  # fmt: skip
    (cells / "lonely").mkdir()
    (cells / "lonely" / "one.jsonl").write_text(json.dumps(training_only) + "\n")
    output_path = str(tmp_path / "tokenized")
    tokenize(TokenizeConfig(input_paths=[str(cells)], tokenizer_path=tokenizer_path, per_folder=True,
                            validation_fraction=VALIDATION_FRACTION, output_path=output_path,
                            parallelism="thread"))  # fmt: skip

    listed = json.loads(Path(output_path, "components.json").read_text())
    assert sorted(listed["components"]) == ["code", "prose"]
    lonely = listed["train_only"]["lonely"]
    assert listed["excluded"] == {} and lonely["train_tokens"] > 0
    assert (lonely["train_docs"], lonely["validation_docs"], lonely["validation_tokens"]) == (1, 0, 0)
    assert load_components(output_path) == {name: f"{output_path}/{name}" for name in ("code", "prose")}
    assert load_components(output_path, train_only=True) == {"lonely": f"{output_path}/lonely"}
    assert len(rows(f"{output_path}/lonely/train")) == 1
    for cell, files in layout.items():
        documents = documents_of([str(file) for file in files])
        for split in ("train", "validation"):
            expected = [d for d in documents if in_validation(d["id"], VALIDATION_FRACTION) == (split == "validation")]
            assert len(rows(f"{output_path}/{cell}/{split}")) == len(expected) > 0
            assert listed["components"][cell][f"{split}_docs"] == len(expected)
    assert not Path(output_path, "train").exists()
    trained, evaluated = mixture_of_a_train_step(output_path, tokenizer_path, str(tmp_path / "train"))
    assert trained == {"code", "prose", "lonely"} and evaluated == {"code", "prose"}


def mixture_of_a_train_step(tokenized: str, tokenizer_path: str, output_path: str) -> tuple[set[str], set[str]]:
    """What Levanter would train on (weighted components with a training cache) and evaluate, for a train step
    over the per-folder output `tokenized`, after the step's own input checks."""
    from haliax import Axis

    from steps.model.model_size import MoeShape
    from steps.train.train import TrainConfig, check_inputs, levanter_config

    vocab = load_tokenizer(tokenizer_path).get_vocab_size()
    shape = MoeShape(d_model=32, n_layers=2, vocab_size=vocab, n_heads=2, head_dim=16, kv_heads_local=1,
                     kv_heads_global=1, global_every=1, sliding_window=None, n_experts=4, top_k=2, expert_width=64,
                     latent_dim=None, n_shared_experts=0, shared_width=0, seq_len=64)  # fmt: skip
    config = TrainConfig(shape=shape, tokenizer_path=tokenizer_path, components={}, components_path=tokenized,
                         output_path=output_path, num_train_steps=2, train_batch_size=8)  # fmt: skip
    check_inputs(config)
    data = levanter_config(config).data
    weights = data.train_weights
    assert isinstance(weights, dict)
    trained = {name for name, cache in data.build_caches("train").items() if weights.get(name, 0) > 0 and len(cache)}
    return trained, set(data.validation_sets(Axis("position", 64)))


def test_a_cell_without_documents_is_counted_and_left_out_of_the_components(tmp_path, tokenizer_path):
    """What a cells step leaves for a cell nothing fell into (an empty Parquet file) is an empty input, counted in
    stats.json; the cell gets no cache and is listed under `excluded`, so no trainer is handed an empty component."""
    cells = tmp_path / "cells"
    documents = [{"id": f"d{i}", "text": f"document number {i}\n"} for i in range(12)]
    jsonl_inputs(cells / "full", {"part.jsonl": documents})
    (cells / "empty").mkdir()
    (cells / "empty" / "empty.parquet").write_bytes(table_bytes(to_table([])))
    output_path = tmp_path / "tokenized"
    tokenize(TokenizeConfig(input_paths=[str(cells)], tokenizer_path=tokenizer_path, per_folder=True, raw_input=False,
                            validation_fraction=0.5, output_path=str(output_path), parallelism="thread"))  # fmt: skip

    listed = json.loads((output_path / "components.json").read_text())
    assert list(listed["components"]) == ["full"]
    assert listed["excluded"] == {"empty": dict.fromkeys(["train_docs", "train_tokens", "validation_docs",
                                                          "validation_tokens"], 0)}  # fmt: skip
    stats = json.loads((output_path / "stats.json").read_text())
    assert stats["empty_files"] == 1 and stats["documents"] == 12
    assert not (output_path / "empty").exists()
    assert len(rows(str(output_path / "full" / "train"))) + len(rows(str(output_path / "full" / "validation"))) == 12
