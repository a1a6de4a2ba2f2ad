"""Shard groups of the tokenize step: small consecutive files share a group up to `group_bytes`, a big file is a
group of its own, a group never spans two components, and however the files are grouped the cache holds the
same rows in the same order, with the ledger Levanter's own consolidation writes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from levanter.store.cache import CacheLedger, consolidate_shard_cache_ledgers

from executor.shards.writer import read_shard_markers
from steps.corpora.text_corpus import TextCorpusConfig, build_text_corpus
from steps.tokenize.groups import component_of, group_files
from steps.tokenize.levanter_cache import load_cache
from steps.tokenize.tokenize import TokenizeConfig, tokenize
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, train_tokenizer


def shard_ids(sizes: list[int], group_bytes: int, files: list[str] | None = None, **kwargs) -> list[str]:
    files = files or [f"in/{index}.jsonl" for index in range(len(sizes))]
    return [shard.shard_id for shard in group_files(None, files, sizes, group_bytes, **kwargs)]


def test_consecutive_small_files_share_a_group_and_a_big_file_is_a_group_of_its_own():
    assert shard_ids([10, 10, 10, 100, 5, 5, 20, 1], 25) == ["00000-00002", "00003", "00004-00006", "00007"]
    assert shard_ids([10, 10, 10], 0) == ["00000", "00001", "00002"]  # 0: one group per file, as before
    assert shard_ids([10, 10, 10], 1 << 30) == ["00000-00002"]
    cells = ["cells/a/0.parquet", "cells/a/1.parquet", "cells/b/0.parquet", "cells/b/1.parquet"]
    assert shard_ids([1, 1, 1, 1], 100, cells, key=component_of) == ["00000-00001", "00002-00003"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Real text in six small JSONL.gz files (4 stdlib modules each), and a tokenizer trained on it."""
    root = tmp_path_factory.mktemp("groups")
    build_text_corpus(TextCorpusConfig(source="python_stdlib", max_docs=24, docs_per_shard=4,
                                       output_path=str(root / "corpus")))  # fmt: skip
    tokenizer = str(root / "tokenizer")
    train_tokenizer(TrainTokenizerConfig(input_paths=[str(root / "corpus")], vocab_size=400, sample_bytes=200_000,
                                         output_path=tokenizer))  # fmt: skip
    return str(root / "corpus" / "shard-*.jsonl.gz"), tokenizer


def run_tokenize(inputs: tuple[str, str], output: Path, group_bytes: int | None = None) -> dict:
    documents, tokenizer = inputs
    config = TokenizeConfig(input_paths=[documents], tokenizer_path=tokenizer, output_path=str(output),
                            validation_fraction=0.3, batch_size=3, parallelism="thread")  # fmt: skip
    tokenize(config if group_bytes is None else dataclasses.replace(config, group_bytes=group_bytes))
    return json.loads((output / "stats.json").read_text())


def rows(split_path: Path) -> list[list[int]]:
    cache = load_cache(str(split_path))
    return [row["input_ids"].tolist() for row in cache.get_batch_sync(list(range(len(cache))))]


def test_grouped_files_give_the_rows_of_one_group_per_file_and_the_ledger_levanter_writes(inputs, tmp_path):
    """By default the six small files are one group (one sub-cache per split, one commit); a middle size groups
    them by twos and threes; every grouping holds the rows of one group per file, in the same order."""
    per_file = run_tokenize(inputs, tmp_path / "per-file", group_bytes=0)
    grouped = run_tokenize(inputs, tmp_path / "grouped")
    sizes = sorted(path.stat().st_size for path in Path(inputs[0]).parent.glob("shard-*.jsonl.gz"))
    middle = run_tokenize(inputs, tmp_path / "middle", group_bytes=sizes[0] + sizes[1])

    assert (per_file["files"], per_file["shards"], grouped["files"], grouped["shards"]) == (6, 6, 6, 1)
    assert 1 < middle["shards"] < 6
    assert set(read_shard_markers(str(tmp_path / "grouped"))) == {"00000-00005"}
    assert [path.name for path in (tmp_path / "grouped" / "train").glob("part-*")] == ["part-00000-00005"]
    for split in ("train", "validation"):
        expected = rows(tmp_path / "per-file" / split)
        assert expected and rows(tmp_path / "grouped" / split) == expected == rows(tmp_path / "middle" / split)
    for key in ("documents", "tokens", "bytes", "splits", "sources", "empty_files"):
        assert per_file[key] == grouped[key] == middle[key], key

    ours = CacheLedger.load(str(tmp_path / "middle" / "train"))
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "middle" / "train", copy)
    (copy / "shard_ledger.json").unlink()
    parts = sorted(str(path) for path in copy.glob("part-*"))
    theirs = consolidate_shard_cache_ledgers(parts, str(copy), {"input_ids": np.zeros((0,), np.int32)}, ours.metadata)
    for field in ("total_num_rows", "shard_rows", "finished_shards", "field_counts", "field_counts_by_shard"):
        assert getattr(ours, field) == getattr(theirs, field), field


def test_a_marker_left_by_another_grouping_is_never_taken_for_a_group(inputs, tmp_path):
    """One group per file first, then the default grouping on the same output (a release that groups, resuming a
    run made before it): the one-file markers name no group of the new grouping, so the group runs and the
    ledger lists its own part only; the rows are those of the first run."""
    output = tmp_path / "out"
    run_tokenize(inputs, output, group_bytes=0)
    before = {split: rows(output / split) for split in ("train", "validation")}
    run_tokenize(inputs, output)
    assert "00000-00005" in read_shard_markers(str(output))
    for split, expected in before.items():
        ledger = json.loads((output / split / "shard_ledger.json").read_text())
        assert ledger["finished_shards"] == ["part-00000-00005"]
        assert rows(output / split) == expected


def test_a_negative_group_size_is_refused_naming_the_step(inputs, tmp_path):
    with pytest.raises(ValueError, match=r"tokenize \(.*out\): group_bytes must be 0 or more"):
        run_tokenize(inputs, tmp_path / "out", group_bytes=-1)
