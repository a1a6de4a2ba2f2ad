"""Errors that named nothing now name the step, the file or component, and what to do (issue 38 point 8).
Each case runs its step through the Executor on a damaged copy of real outputs: FAILED, never SUCCESS, and a
message a newcomer can act on."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import test_train_bad_input
from test_train import SOURCES, build_data, train_config
from test_train_bad_input import (
    checkpoint_copy,
    evaluate_through_executor,
    run_through_executor,
    train_through_executor,
)

from executor import THIS_OUTPUT_PATH
from steps.tokenize.eval_suite import EvalSuiteConfig, build_eval_suite
from steps.tokenize.tokenize import TokenizeConfig, tokenize

trained = test_train_bad_input.trained
"""One tiny run trained through the Executor (a module fixture of test_train_bad_input's)."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_data(tmp_path_factory.mktemp("named-errors-data"))


def copied(data: dict[str, str], tmp_path: Path, key: str) -> Path:
    copy = tmp_path / f"copy-{Path(data[key]).name}"
    shutil.copytree(data[key], copy)
    return copy


def edit_ledger(folder: Path, **changes: object) -> Path:
    ledger = folder / "train" / "shard_ledger.json"
    ledger.write_text(json.dumps({**json.loads(ledger.read_text()), **changes}))
    return ledger


def test_a_truncated_tokenizer_json_names_the_file_and_the_step_that_wrote_it(data, tmp_path):
    tokenizer = copied(data, tmp_path, "tokenizer")
    text = (tokenizer / "tokenizer.json").read_text()
    (tokenizer / "tokenizer.json").write_text(text[: len(text) // 2])
    status, message, output = train_through_executor(tmp_path / "prefix", train_config(data, "unused",
                                                      tokenizer_path=str(tokenizer)))  # fmt: skip
    assert status == "FAILED"
    assert f"train step {output.name} ({output}): {tokenizer}/tokenizer.json is not a readable tokenizer" in message
    assert "rerun the train_tokenizer step that wrote it" in message


def test_weights_with_no_phases_are_refused_naming_the_file(data, tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "weights.json").write_text(json.dumps({"phases": []}))
    config = train_config(data, "unused", mixture_weights_path=str(folder))
    status, message, output = train_through_executor(tmp_path / "prefix", config)
    assert status == "FAILED"
    assert f"train step {output.name} ({output}): {folder}/weights.json lists no phases ([])" in message
    assert "rerun its mixture_weights step" in message


@pytest.mark.parametrize(
    ("changes", "expected"),
    [({"total_num_rows": 10_000}, "says total_num_rows=10000 but its parts hold"),
     ({"is_finished": False}, "says the cache is unfinished (is_finished: false)")],
)  # fmt: skip
def test_a_ledger_that_lies_names_the_component_and_the_ledger(data, tmp_path, changes, expected):
    component = copied(data, tmp_path, SOURCES[0])
    ledger = edit_ledger(component, **changes)
    config = train_config(data, "unused", components={SOURCES[0]: str(component), SOURCES[1]: data[SOURCES[1]]})
    status, message, output = train_through_executor(tmp_path / "prefix", config)
    assert status == "FAILED"
    assert f"train step {output.name} ({output}): component {SOURCES[0]!r}: {ledger} {expected}" in message
    assert "rerun the tokenize step that wrote it" in message


def test_a_component_shorter_than_one_sequence_is_refused_before_levanter(data, tmp_path):
    documents = tmp_path / "short.jsonl"
    documents.write_text("".join(json.dumps({"id": f"d{i}", "text": "def f(): pass"}) + "\n" for i in range(6)))
    short = tmp_path / "short"
    tokenize(TokenizeConfig(input_paths=[str(documents)], tokenizer_path=data["tokenizer"], validation_fraction=0.5,
                            output_path=str(short), parallelism="thread"))  # fmt: skip
    config = train_config(data, "unused", components={SOURCES[0]: data[SOURCES[0]], "short": str(short)})
    status, message, _output = train_through_executor(tmp_path / "prefix", config)
    assert status == "FAILED"
    assert f"component 'short' at {short}/train holds" in message and "less than one sequence of 64" in message
    assert "give it more documents, or leave it out" in message


def test_an_eval_suite_without_subsets_says_so(data, tmp_path):
    config = EvalSuiteConfig(subsets={}, tokenizer_path=data["tokenizer"], output_path=THIS_OUTPUT_PATH,
                             tokens_per_subset=1024, min_tokens=64)  # fmt: skip
    status, message, output = run_through_executor(tmp_path / "prefix", "eval/suite", build_eval_suite, config)
    assert status == "FAILED"
    assert f"eval suite step {output.name} ({output}): subsets is empty" in message and "1024 < 64" not in message
    config = dataclasses.replace(config, subsets={"a": str(tmp_path)}, tokens_per_subset=10)
    status, message, _ = run_through_executor(tmp_path / "prefix2", "eval/suite", build_eval_suite, config)
    assert status == "FAILED" and "tokens_per_subset=10 is below min_tokens=64" in message


@pytest.mark.parametrize("damage", ["d", "manifest.ocdbt", "a file"])
def test_an_evaluate_of_a_checkpoint_missing_part_of_its_database_names_it(data, trained, tmp_path, damage):
    checkpoints, latest = checkpoint_copy(trained, tmp_path)
    if damage == "a file":
        latest = checkpoints / "step-99999"
        latest.write_text("not a checkpoint")
        expected = f"{latest} is a file, not a checkpoint folder"
    else:
        target = latest / damage
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        expected = f"the checkpoint {latest} is damaged: its {damage} is missing"
    status, message, output = evaluate_through_executor(data, tmp_path / "prefix", checkpoints)
    assert status == "FAILED" and not (output / "results.json").exists()
    assert f"evaluate step {output.name} ({output}): {expected}" in message
    assert f"Move {latest} aside to use the previous complete checkpoint" in message


def test_a_parquet_input_cut_in_half_names_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup

    inputs = tmp_path / "in"
    inputs.mkdir()
    numbers = range(2000)
    table = pa.table({"id": [f"d{i}" for i in numbers], "text": [f"document number {i} " * 20 for i in numbers]})
    pq.write_table(table, inputs / "part.parquet")
    whole = (inputs / "part.parquet").read_bytes()
    (inputs / "part.parquet").write_bytes(whole[: len(whole) // 2])
    config = ExactDedupConfig(input_paths=[str(inputs)], output_path=THIS_OUTPUT_PATH, parallelism="thread")
    status, message, _ = run_through_executor(tmp_path / "prefix", "dedup/exact", exact_dedup, config)
    assert status == "FAILED"
    assert f"input file {inputs}/part.parquet is not a readable Parquet file" in message
    assert "download it again, or rerun the step that wrote it" in message
