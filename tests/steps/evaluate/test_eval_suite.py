"""The external eval suite (issue 21): held-out subsets of text training never reads, each capped to the same
tokens with the run's tokenizer, scored by the train step's periodic evals and by the evaluate step on the same
sequences, whatever the train batch; the hero DAG decontaminates its training data against the suite's text and
fits the ladder on the suite's macro loss. The last test trains a tiny model (minutes on 2 busy cores)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from paths import SUPPORT

from executor import VersionedValue
from executor.dag.plan import build_plan
from executor.dag.records import output_digest
from experiments import hero_535b
from experiments.eval_suite import LOCK_FILE, PALOMA_SUBSETS, TINY_SUITE_SUBSETS
from steps.corpora.eval_suite_text import (
    SUBSETS,
    TRAINING_PACKAGES,
    EvalSuiteTextConfig,
    build_eval_suite_text,
    passages,
)
from steps.corpora.locked_packages import (
    LockedPackageError,
    file_sha256,
    locked_files,
    locked_versions,
    read_verified,
)
from steps.corpora.text_corpus import TextCorpusConfig, build_text_corpus
from steps.filter.decontaminate import DecontaminateConfig
from steps.scaling.ladder_config import SUITE_MACRO_LOSS
from steps.tokenize.eval_suite import EvalSuiteConfig, EvalSuiteError, build_eval_suite, load_suite
from steps.tokenize.levanter_cache import load_cache
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, load_tokenizer, train_tokenizer


def _config(output_path: Path, subsets: list[str], lock_file: Path = LOCK_FILE, **kwargs: int) -> EvalSuiteTextConfig:
    return EvalSuiteTextConfig(str(output_path), subsets, str(lock_file), file_sha256(lock_file), **kwargs)


def test_the_suite_is_nine_subsets_of_the_locked_packages_text_each_file_named_with_its_version(tmp_path: Path):
    """Every passage comes from a file of a package the lock pins, at the locked version, whose bytes are its wheel's
    (RECORD's sha256); stats.json says which, and the lock's digest; no subset reads a `.py` file or a package whose
    docstrings training reads; each subset stops at its byte cap and spans several files."""
    stats = build_eval_suite_text(_config(tmp_path, list(TINY_SUITE_SUBSETS), bytes_per_subset=4000))
    written = json.loads((tmp_path / "stats.json").read_text())
    assert written["lock_sha256"] == file_sha256(LOCK_FILE) and written["subsets"] == stats
    assert len(stats) == len(TINY_SUITE_SUBSETS) >= 8 and set(TINY_SUITE_SUBSETS) == set(SUBSETS)
    pinned = locked_versions(LOCK_FILE)
    root = Path(sysconfig.get_paths()["purelib"])
    for subset, figures in stats.items():
        records = [json.loads(line) for line in (tmp_path / "subsets" / subset / "passages.jsonl").open()]
        assert 4000 <= figures["bytes"] < 4000 + 150 * 40, (subset, figures["bytes"])  # stops at the cap
        assert [record["id"] for record in records] == figures["ids"] and len(set(figures["ids"])) == len(records)
        assert len({record["text"] for record in records}) == len(records)  # licences repeat; passages do not
        assert len(figures["sources"]) >= 2, subset  # spread over files, at most two passages each
        for source in figures["sources"]:
            assert pinned[source["package"]] == source["version"], source
            assert hashlib.sha256((root / source["path"]).read_bytes()).hexdigest() == source["sha256"], source
            assert not source["path"].endswith(".py") and source["package"] not in TRAINING_PACKAGES, source
        files = {f"{subset}/{source['package']}/{source['path']}" for source in figures["sources"]}
        assert {record["id"].rsplit("#", 1)[0] for record in records} == files
    assert TRAINING_PACKAGES >= {"requests", "sympy", "scipy", "pandas"}
    with pytest.raises(ValueError, match=r"subsets \['nope'\] are not among"):
        build_eval_suite_text(_config(tmp_path / "x", ["nope"]))


def test_a_lock_the_install_does_not_match_or_another_lock_is_refused_by_name(tmp_path: Path) -> None:
    """A lock pinning a version .venv does not hold fails before any text is read, naming the package; a lock file
    edited after the DAG was built fails on its digest; a file whose bytes are not its wheel's fails by path."""
    edited = tmp_path / "requirements.lock"
    edited.write_text(LOCK_FILE.read_text().replace(f"numpy=={locked_versions(LOCK_FILE)['numpy']}", "numpy==0.0.1"))
    with pytest.raises(LockedPackageError, match=r"numpy==0\.0\.1 is pinned by .* but is installed at .*make install"):
        build_eval_suite_text(_config(tmp_path / "a", ["c_headers"], lock_file=edited))
    stale = EvalSuiteTextConfig(str(tmp_path / "b"), ["c_headers"], str(edited), file_sha256(LOCK_FILE))
    with pytest.raises(LockedPackageError, match=r"has sha256 \w+…, not the \w+… its config was built with"):
        build_eval_suite_text(stale)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    header = next(file for file in locked_files(LOCK_FILE) if file.path.endswith(".h"))
    copy = tmp_path / "site" / header.path
    copy.parent.mkdir(parents=True)
    copy.write_bytes(read_verified(header) + b"/* edited */\n")
    with pytest.raises(LockedPackageError, match=r"its wheel's RECORD says"):
        read_verified(dataclasses.replace(header, root=str(tmp_path / "site")))


def test_code_keeps_its_lines_and_prose_is_joined_into_paragraphs() -> None:
    text = "int f(void);\n  int g(int x);\n\n\n/* a comment */\nint h;\n"
    assert list(passages(text, 150, code=True)) == ["int f(void);\n  int g(int x);\n\n/* a comment */\nint h;"]
    assert list(passages(text, 6, code=True)) == ["int f(void);\n  int g(int x);", "/* a comment */\nint h;"]
    assert list(passages(text, 4, code=True)) == ["int f(void);", "  int g(int x);", "/* a comment */", "int h;"]
    assert list(passages("one two\nthree\n\nfour", 150)) == ["one two three\nfour"]


@pytest.mark.slow
def test_the_suite_step_gives_the_same_digest_with_the_operating_systems_usr_share_hidden(tmp_path: Path) -> None:
    """The step run by the executor as usual, then again under another prefix in a mount namespace where /usr/share
    is an empty tmpfs (no man pages, no Debian docs, no fonts or locales): the same output digest, byte for byte."""
    if subprocess.run(["unshare", "--mount", "--map-root-user", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --mount --map-root-user is not permitted here (no user namespaces)")
    runs = {}
    for hidden in (False, True):
        prefix = str(tmp_path / ("hidden" if hidden else "plain"))
        command = [sys.executable, str(SUPPORT / "eval_suite_runner.py"), prefix]
        if hidden:
            shell = 'mount -t tmpfs none /usr/share && exec "$@"'
            command = ["unshare", "--mount", "--map-root-user", "sh", "-c", shell, "sh", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[hidden] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs[True]["usr_share"] == [] and "man" in runs[False]["usr_share"]
    manifests = {hidden: json.loads(Path(run["output_path"], ".executor_manifest").read_text())
                 for hidden, run in runs.items()}  # fmt: skip
    assert Path(runs[True]["output_path"]).name == Path(runs[False]["output_path"]).name  # the same step hash
    assert manifests[True]["digest"] == manifests[False]["digest"] == output_digest(manifests[False]["files"])
    assert len(manifests[True]["files"]) == len(TINY_SUITE_SUBSETS) + 1  # each subset's passages and stats.json


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("suite-tokenizer")
    build_text_corpus(TextCorpusConfig(source="python_docstrings", max_docs=30, output_path=str(root / "corpus")))
    train_tokenizer(TrainTokenizerConfig(input_paths=[str(root / "corpus")], vocab_size=512, sample_bytes=300_000,
                                         output_path=str(root / "tokenizer")))  # fmt: skip
    return str(root / "tokenizer")


def _write_docs(folder: Path, documents: list[tuple[str, str]], files: int = 1) -> str:
    """`documents` (id, text) spread round robin over `files` JSONL files in `folder`."""
    folder.mkdir(parents=True)
    for index in range(files):
        chunk = documents[index::files]
        (folder / f"part-{index}.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in chunk))
    return str(folder)


def _cache_tokens(split_path: Path) -> np.ndarray:
    cache = load_cache(str(split_path))
    return np.concatenate([row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))])


def test_every_subset_holds_exactly_the_cap_whatever_its_documents_and_their_files(tokenizer: str, tmp_path: Path):
    """One long document and many short ones weigh the same: both subsets hold exactly `tokens_per_subset` tokens
    (the last document cut short), taken in id-hash order, so the files' order changes nothing."""
    prose = (Path(__file__).read_text() + "\n") * 3
    many = [(f"doc-{index}", prose[index * 300 : index * 300 + 300]) for index in range(60)]
    subsets = {"one_long": _write_docs(tmp_path / "long", [("only", prose)]),
               "many_short": _write_docs(tmp_path / "short", many, files=3),
               "same_reshuffled": _write_docs(tmp_path / "reshuffled", many[::-1], files=2)}  # fmt: skip
    document = build_eval_suite(EvalSuiteConfig(subsets=subsets, tokenizer_path=tokenizer, tokens_per_subset=1024,
                                                output_path=str(tmp_path / "suite"), min_tokens=64))  # fmt: skip
    assert {name: figures["tokens"] for name, figures in document["subsets"].items()} == dict.fromkeys(subsets, 1024)
    assert document["subsets"]["one_long"]["documents"] == 1 and document["subsets"]["many_short"]["documents"] > 5
    streams = {name: _cache_tokens(tmp_path / "suite" / name / "validation") for name in subsets}
    assert all(len(stream) == 1024 for stream in streams.values())
    assert np.array_equal(streams["many_short"], streams["same_reshuffled"])
    assert load_suite(str(tmp_path / "suite")) == {f"suite/{name}": str(tmp_path / "suite" / name) for name in subsets}
    text = load_tokenizer(tokenizer).decode(streams["one_long"].tolist(), skip_special_tokens=True)
    assert document["subsets"]["one_long"]["bytes"] == len(text.encode()) and prose.startswith(text)


def test_a_subset_shorter_than_one_sequence_is_refused_by_name(tokenizer: str, tmp_path: Path) -> None:
    subsets = {"tiny_one": _write_docs(tmp_path / "t", [("a", "just a few words")])}
    with pytest.raises(EvalSuiteError, match=r"subset tiny_one \(.*/t\) holds \d+ tokens, fewer than one sequence"):
        build_eval_suite(EvalSuiteConfig(subsets=subsets, tokenizer_path=tokenizer, tokens_per_subset=1024,
                                         output_path=str(tmp_path / "suite"), min_tokens=64))  # fmt: skip


def _steps(scale: str) -> dict:
    chosen = hero_535b.tiny_scale() if scale == "tiny" else hero_535b.full_scale()
    return {step.name: step for step in hero_535b.build_dag(chosen).steps}


@pytest.mark.parametrize("scale", ["tiny", "full"])
def test_the_hero_dag_decontaminates_against_the_suite_and_fits_its_macro_loss(scale: str) -> None:
    """Every source is decontaminated against the suite's text; every train and evaluate step reads the one suite,
    over the same number of sequences (eval batch x eval batches) whatever its train batch; the ladder fits the
    suite's macro loss. Full scale: Paloma's 16 subsets."""
    steps = _steps(scale)
    suite = steps["eval_suite"]
    subsets = suite.config.subsets
    assert len(subsets) == 16 if scale == "full" else len(subsets) >= 8
    if scale == "full":
        assert set(subsets) == set(PALOMA_SUBSETS) and "download/paloma" in steps
    plan = {planned.name: planned for planned in build_plan(list(steps.values()), "/prefix").steps}
    suite_text = {str(path) for path in subsets.values()}
    for name, step in steps.items():
        if name.endswith("/decontaminate"):
            assert isinstance(step.config, DecontaminateConfig)
            assert suite_text <= {str(path) for path in step.config.eval_paths}, name
    trains = [step for name, step in steps.items() if name.startswith("train/")]
    evaluates = [step for name, step in steps.items() if name.startswith("evaluate/")]
    assert len(trains) == len(evaluates) == 5
    for train, evaluate in zip(trains, evaluates, strict=True):
        assert str(train.config.eval_suite_path) == str(evaluate.config.eval_suite_path) != "None"
        read_in_training = train.config.eval_batch_size * train.config.max_eval_batches
        assert read_in_training == evaluate.config.batch_size * evaluate.config.max_batches.value, train.name
        assert "eval_suite" in {dependency.name for dependency in plan[evaluate.name].dependencies}
    # One eval batch for every run whatever its train batch: the rungs' curves and the hero's are one measurement.
    assert len({train.config.eval_batch_size for train in trains}) == 1
    assert len({train.config.train_batch_size.value for train in trains}) > 1 or scale == "tiny"
    assert steps["scaling/ladder"].config.metric == VersionedValue(SUITE_MACRO_LOSS)
    if scale == "tiny":  # each subset is read whole by every eval: exactly the eval batches' sequences
        seq_len = trains[0].config.shape.value.seq_len
        assert suite.config.tokens_per_subset.value == read_in_training * seq_len


def test_the_suite_text_never_enters_training_in_the_tiny_dag() -> None:
    """Its subsets are not among the real corpus's domains the tiny sources download."""
    steps = _steps("tiny")
    corpus_domains = set(steps["raw/real_corpus"].config.domains.value)
    assert corpus_domains and not corpus_domains & set(SUBSETS)


# --- a tiny model trained and evaluated on the suite (slow: Levanter compiles on CPU) ------------------------------

EVAL_BATCH, EVAL_BATCHES, TRAIN_BATCH, SEQ_LEN = 4, 2, 8, 64


@pytest.mark.slow
@pytest.mark.training
@pytest.mark.timeout(1500)
def test_train_and_evaluate_score_the_suite_on_the_same_sequences_whatever_the_train_batch(tokenizer, tmp_path):
    """The train step logs each subset's loss and the suite's macro loss (the unweighted mean) at every eval; the
    evaluate step's `macro_loss` is that same figure at the end, and its cell's loss the train step's last one:
    both read eval batch x eval batches sequences, not train batch x eval batches as Levanter would by default,
    and both score with the run's expert capacity (a fair share per sequence here, so some copies are dropped:
    the evaluate step reports their share, and the same weights scored dropless)."""
    from test_train_bad_input import run_through_executor

    from executor import THIS_OUTPUT_PATH
    from steps.evaluate.evaluate import EvaluateConfig, evaluate
    from steps.model.model_size import MoeShape
    from steps.tokenize.tokenize import TokenizeConfig, tokenize
    from steps.train.train import TrainConfig, train
    from steps.train.train_metrics import read_metrics

    root = Path(tokenizer).parent
    cell = str(tmp_path / "cell")
    tokenize(TokenizeConfig(input_paths=[str(root / "corpus" / "shard-*")], tokenizer_path=tokenizer,
                            validation_fraction=0.5, output_path=cell, parallelism="thread"))  # fmt: skip
    prose = (Path(__file__).read_text() + "\n") * 2
    subsets = {"alpha": _write_docs(tmp_path / "alpha", [(f"a{i}", prose[i * 500 : i * 500 + 500]) for i in range(30)]),
               "beta": _write_docs(tmp_path / "beta", [("b", prose[::-1])])}  # fmt: skip
    suite = str(tmp_path / "suite")
    cap = EVAL_BATCH * EVAL_BATCHES * SEQ_LEN  # each subset read whole by every eval
    build_eval_suite(EvalSuiteConfig(subsets=subsets, tokenizer_path=tokenizer, output_path=suite,
                                     tokens_per_subset=cap, min_tokens=SEQ_LEN))  # fmt: skip
    shape = MoeShape(d_model=32, n_layers=2, vocab_size=load_tokenizer(tokenizer).get_vocab_size(), n_heads=2,
                     head_dim=16, kv_heads_local=1, kv_heads_global=1, global_every=1, sliding_window=None,
                     n_experts=4, top_k=2, expert_width=64, latent_dim=None, n_shared_experts=0, shared_width=0,
                     seq_len=SEQ_LEN)  # fmt: skip
    config = TrainConfig(shape=shape, tokenizer_path=tokenizer, components={"cell": cell}, output_path=THIS_OUTPUT_PATH,
                         num_train_steps=4, train_batch_size=TRAIN_BATCH, learning_rate=1e-2, steps_per_eval=2,
                         max_eval_batches=EVAL_BATCHES, eval_batch_size=EVAL_BATCH, eval_suite_path=suite,
                         checkpoint_every_steps=4, watch_interval=100, hf_export=False,
                         capacity_factor=1.0)  # fmt: skip
    status, message, output = run_through_executor(tmp_path / "prefix", "train/suite", train, config)
    assert status == "SUCCESS", message
    evals = [record for record in read_metrics(str(output)) if SUITE_MACRO_LOSS in record]
    assert len(evals) >= 2
    for record in evals:
        losses = [record[f"eval/suite/{name}/loss"] for name in subsets]
        assert record[SUITE_MACRO_LOSS] == pytest.approx(float(np.mean(losses)), rel=1e-5)
        assert all(f"eval/suite/{name}/bpb" in record for name in subsets) and "eval/cell/loss" in record
    evaluated = EvaluateConfig(checkpoint_path=str(output / "checkpoints"), shape=shape, tokenizer_path=tokenizer,
                               components={"cell": cell}, output_path=str(tmp_path / "evaluate"),
                               batch_size=EVAL_BATCH, max_batches=EVAL_BATCHES, eval_suite_path=suite,
                               capacity_factor=1.0)  # fmt: skip
    results = evaluate(evaluated)
    assert results["metric"] == "eval_suite" and set(results["suite"]) == set(subsets)
    assert results["macro_loss"] == pytest.approx(evals[-1][SUITE_MACRO_LOSS], rel=1e-3)
    assert results["macro_loss"] == pytest.approx(float(np.mean([s["loss"] for s in results["suite"].values()])))
    assert results["components_macro_loss"] == pytest.approx(evals[-1]["eval/cell/loss"], rel=1e-3)
    assert results["components"]["cell"]["loss"] != pytest.approx(results["macro_loss"], rel=1e-5)
    assert 0 < results["dropped_fraction"] < 0.5 and 0 < results["components"]["cell"]["dropped_fraction"] < 0.5
    # The eval of the final model counts its drops too, on the same weights and sequences as the evaluate step (the
    # evals before it leave that second forward pass out).
    drops = [record for record in read_metrics(str(output)) if "eval/dropped_fraction" in record]
    assert len(evals) > 1 and [record["step"] for record in drops] == [evals[-1]["step"]]
    assert drops[-1]["eval/dropped_fraction"] == pytest.approx(results["dropped_fraction"], rel=1e-3)
    assert drops[-1]["eval/cell/dropped_fraction"] == pytest.approx(results["components"]["cell"]["dropped_fraction"],
                                                                   rel=1e-3)  # fmt: skip
    assert set(results["dropless"]["suite"]) == set(subsets)
    assert results["dropless"]["macro_loss"] != pytest.approx(results["macro_loss"], rel=1e-4)


def test_the_run_view_and_the_band_alert_follow_the_suites_macro_loss() -> None:
    """With an eval suite the prediction is of `eval/suite/macro_loss`: the run view's eval line and the
    prediction-band alert read it (not Levanter's mean over cells and subsets together); the cells stay a panel of
    their own, and "suite" (Levanter's micro average over the subsets) is no cell."""
    from executor.watch.training.alerts import below_band
    from executor.watch.training.panels import eval_components, macro_eval

    row = {"eval/macro_loss": 3.0, SUITE_MACRO_LOSS: 6.0, "eval/suite/loss": 5.9, "eval/suite/man_syscalls/loss": 6.1,
           "eval/suite/email_messages/loss": 5.9, "eval/cell_0/loss": 2.5}  # fmt: skip
    rows = {9: row, 19: {**row, SUITE_MACRO_LOSS: 5.5}}
    assert eval_components(rows) == ["cell_0"]
    assert eval_components(rows, "eval/suite/") == ["email_messages", "man_syscalls"]
    assert macro_eval(row, ["cell_0"]) == 6.0
    curve = [{"step": 0, "high": 5.0}, {"step": 30, "high": 5.0}]
    alerts = below_band(rows, curve, margin=0.1, now=0.0)
    assert alerts and all(SUITE_MACRO_LOSS in alert.message for alert in alerts)
