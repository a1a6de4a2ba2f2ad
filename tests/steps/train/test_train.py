"""The train and evaluate steps on real Levanter, on CPU: a tiny MoE (2 layers, 4 experts, top-2, router-bias
balancing and router z-loss on) trains on two tokenized components of real text. One run serves most
assertions, because Levanter's CPU compile is the slow part: it is started in an executor subprocess,
SIGKILLed once a temporary checkpoint exists, and rerun to the end. From its metrics.jsonl and checkpoints
the tests read that the loss falls, that the rerun resumed at the killed run's checkpoint step, that every
promised metric was logged and that the caches were only read; the evaluate step then scores the final
checkpoint and must agree with the train step's own last eval. Bad input is refused before any compute."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from paths import REPO, with_wandb_as_shipped

from steps.corpora.text_corpus import TextCorpusConfig, build_text_corpus
from steps.evaluate.evaluate import EvaluateConfig, evaluate
from steps.model.hf_export import HF_FOLDER, load_hf_export
from steps.model.model_size import MoeShape
from steps.tokenize.levanter_cache import load_cache
from steps.tokenize.tokenize import TokenizeConfig, tokenize
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, load_tokenizer, train_tokenizer
from steps.train.input_checks import TrainInputError
from steps.train.optimizer import OPTIMIZER_GROUPS_FILE
from steps.train.train import TrainConfig, check_inputs, close_log_files, data_mixture, training_environment
from steps.train.train_config import MoeHeuristic
from steps.train.train_metrics import read_metrics

SOURCES = ("python_stdlib", "python_docstrings")
STEPS = 40
EVAL_BATCHES = 2  # of train_batch_size sequences: the stdlib validation split alone holds ~500
# The shared run compiles the model twice (killed run, rerun): minutes on 2 busy cores.
pytestmark = [pytest.mark.slow, pytest.mark.training, pytest.mark.timeout(1500)]


def tiny_shape(vocab_size: int, **changes: int) -> MoeShape:
    fields = dict(d_model=32, n_layers=2, vocab_size=vocab_size, n_heads=2, head_dim=16, kv_heads_local=1,
                  kv_heads_global=1, global_every=1, sliding_window=None, n_experts=4, top_k=2, expert_width=64,
                  latent_dim=None, n_shared_experts=0, shared_width=0, seq_len=64)  # fmt: skip
    return MoeShape(**{**fields, **changes})


def build_data(root: Path) -> dict[str, str]:
    """A tokenizer and two tokenize-step outputs (train/ and validation/ caches) of real text under `root`."""
    for source in SOURCES:
        build_text_corpus(TextCorpusConfig(source=source, max_docs=30, docs_per_shard=30,
                                           output_path=str(root / "corpus" / source)))  # fmt: skip
    tokenizer = str(root / "tokenizer")
    train_tokenizer(TrainTokenizerConfig(input_paths=[str(root / "corpus" / s) for s in SOURCES], vocab_size=512,
                                         sample_bytes=300_000, output_path=tokenizer))  # fmt: skip
    paths = {"tokenizer": tokenizer}
    for source in SOURCES:
        paths[source] = str(root / "tokenized" / source)
        documents = str(root / "corpus" / source / "shard-*.jsonl.gz")
        tokenize(TokenizeConfig(input_paths=[documents], tokenizer_path=tokenizer, validation_fraction=0.2,
                                output_path=paths[source], parallelism="thread"))  # fmt: skip
    return paths


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_data(tmp_path_factory.mktemp("train-data"))


def train_config(data: dict[str, str], output_path: str, **changes) -> TrainConfig:
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    fields = dict(shape=tiny_shape(vocab), tokenizer_path=data["tokenizer"],
                  components={source: data[source] for source in SOURCES}, output_path=output_path,
                  num_train_steps=STEPS, train_batch_size=8, learning_rate=1e-2, steps_per_eval=STEPS // 2,
                  max_eval_batches=EVAL_BATCHES, checkpoint_every_steps=STEPS // 2, temporary_checkpoint_seconds=3.0,
                  watch_interval=5, peak_flops_per_device=1e11, router_bias_balancing=True,
                  router_z_loss_weight=1e-4)  # fmt: skip
    return TrainConfig(**{**fields, **changes})


RUNNER = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.INFO)
    from executor import Executor, ExecutorStep, THIS_OUTPUT_PATH
    from steps.model.model_size import MoeShape
    from steps.train.optimizer import HeroHyperparameters
    from steps.train.train import TrainConfig, train
    fields = json.loads(sys.argv[2])
    fields["shape"] = MoeShape(**fields["shape"])
    if fields["hero_hyperparameters"] is not None:
        fields["hero_hyperparameters"] = HeroHyperparameters(**fields["hero_hyperparameters"])
    fields["output_path"] = THIS_OUTPUT_PATH
    step = ExecutorStep(name="train/tiny-moe", fn=train, config=TrainConfig(**fields))
    executor = Executor(sys.argv[1])
    executor.run([step])
    print("OUTPUT", executor.output_paths[step], flush=True)
""")


def start_train(prefix: Path, config: TrainConfig, log: Path, wandb: bool = False) -> subprocess.Popen:
    """The train step of `config` in an executor subprocess under `prefix`, its output appended to `log`; with
    `wandb`, wandb writes its offline files as in a user's run (the suite turns it off elsewhere: tests/conftest.py)."""
    fields = {name: getattr(config, name) for name in config.__dataclass_fields__ if name != "output_path"}
    fields["shape"] = config.shape.__dict__
    if config.hero_hyperparameters is not None:
        fields["hero_hyperparameters"] = dataclasses.asdict(config.hero_hyperparameters)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-c", RUNNER, str(prefix), json.dumps(fields)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                                env={**(with_wandb_as_shipped(os.environ) if wandb else os.environ),
                                     "PYTHONUNBUFFERED": "1"})  # fmt: skip


def checkpoint_steps(output_path: Path) -> list[int]:
    """Steps of the complete checkpoints (Levanter writes metadata.json last)."""
    complete = output_path.glob("checkpoints/step-*/metadata.json")
    return sorted(int(path.parent.name.removeprefix("step-")) for path in complete)


def train_losses(records: list[dict]) -> list[tuple[int, float]]:
    return [(record["step"], record["train/loss"]) for record in records if "train/loss" in record]


def files_under(folders: list[str]) -> dict[str, int]:
    return {str(path): path.stat().st_size for folder in folders for path in Path(folder).rglob("*") if path.is_file()}


def kill_and_resume(data: dict[str, str], prefix: Path, config: TrainConfig, wandb: bool = False) -> dict:
    """Run the train step in an executor subprocess, SIGKILL it once a temporary checkpoint below the last
    step is complete, rerun it to the end; return what both runs left. `wandb`: as in `start_train`."""
    caches_before = files_under([data[source] for source in SOURCES])
    log = prefix / "runs.log"
    first = start_train(prefix, config, log, wandb)
    killed_at: list[int] = []
    deadline = time.monotonic() + 1800
    while first.poll() is None and time.monotonic() < deadline:
        outputs = list(prefix.glob("train/tiny-moe-*"))
        steps = checkpoint_steps(outputs[0]) if outputs else []
        if steps and 0 < steps[-1] < STEPS:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            killed_at = checkpoint_steps(outputs[0])  # another may have completed before the kill landed
            break
        time.sleep(0.05)
    assert killed_at, f"no checkpoint appeared before the run ended; see {log}:\n{log.read_text()[-3000:]}"
    output_path = next(prefix.glob("train/tiny-moe-*"))
    records_before = len(read_metrics(str(output_path)))
    second = start_train(prefix, config, log, wandb)
    assert second.wait(timeout=1800) == 0, log.read_text()[-3000:]
    return {"output_path": output_path, "killed_at": killed_at, "records_before": records_before,
            "records": read_metrics(str(output_path)), "log": log, "caches_before": caches_before,
            "caches_after": files_under([data[source] for source in SOURCES])}  # fmt: skip


def run_whole(prefix: Path, config: TrainConfig) -> list[dict]:
    """The metrics of `config`'s run, trained start to end without a kill."""
    log = prefix / "run.log"
    assert start_train(prefix, config, log).wait(timeout=1800) == 0, log.read_text()[-3000:]
    return read_metrics(str(next(prefix.glob("train/tiny-moe-*"))))


@pytest.fixture(scope="module")
def killed_and_resumed(data: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The killed and resumed run, with wandb's offline files as a user's run writes them (the wandb service
    stopped at the kill, its run resumed by the rerun, no error at exit)."""
    return kill_and_resume(data, tmp_path_factory.mktemp("train-prefix"), train_config(data, "unused"), wandb=True)


def test_moe_trains_and_its_loss_falls(killed_and_resumed):
    losses = train_losses(killed_and_resumed["records"])
    first_steps = [loss for step, loss in losses[:3]]
    last_steps = [loss for step, loss in losses[-3:]]
    assert max(step for step, _ in losses) == STEPS - 1
    assert sum(last_steps) / 3 < 0.8 * sum(first_steps) / 3, losses


def test_a_finished_run_exits_without_errors_at_shutdown(killed_and_resumed):
    # Levanter's wandb tracker left an atexit hook that starts a thread at interpreter exit.
    assert "Exception ignored in atexit" not in killed_and_resumed["log"].read_text()


def test_rerun_resumes_from_the_killed_runs_checkpoint(killed_and_resumed):
    records = killed_and_resumed["records"]
    before, after = records[: killed_and_resumed["records_before"]], records[killed_and_resumed["records_before"] :]
    resumed_steps = [step for step, _ in train_losses(after)]
    checkpoint = killed_and_resumed["killed_at"][-1]
    # Levanter's checkpoint step-N holds the state after optimizer step N: the rerun continues at N + 1.
    assert resumed_steps[0] == checkpoint + 1, (checkpoint, resumed_steps[:5])
    # Levanter logs the last step twice (its final hooks run again after the loop).
    assert sorted(set(resumed_steps)) == list(range(checkpoint + 1, STEPS)), resumed_steps
    assert train_losses(before)[0][0] == 0
    assert "Resuming training from step" in killed_and_resumed["log"].read_text()
    final = checkpoint_steps(killed_and_resumed["output_path"])
    assert final[-1] == STEPS - 1  # Levanter names the final checkpoint by the last step's index
    # The rerun ended with the HF export of the trained model (steps/model/hf_export.py): its router bias has moved.
    exported = load_hf_export(str(killed_and_resumed["output_path"] / HF_FOLDER))
    assert any(np.any(layer.mlp.balance.bias.array != 0) for layer in exported.transformer.layers_in_order())


@pytest.fixture(scope="module")
def uninterrupted(data: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The metrics of the same run, trained start to end without a kill."""
    return run_whole(tmp_path_factory.mktemp("train-uninterrupted"), train_config(data, "unused"))


def hero_config(data: dict[str, str]) -> TrainConfig:
    """The same run under the hero's optimizer, at the heuristic's rates for its compute (steps/train/optimizer.py)."""
    rates = MoeHeuristic().hyperparameters(STEPS * 8 * 64, 8 * 64, 32)
    return train_config(data, "unused", optimizer="hero", hero_hyperparameters=rates, lr_schedule="linear",
                        min_lr_ratio=0.05)  # fmt: skip


@pytest.fixture(scope="module")
def hero_runs(data: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict], Path]:
    """The hero-optimizer run killed and resumed, and trained whole (its metrics and output path)."""
    resumed = kill_and_resume(data, tmp_path_factory.mktemp("hero-prefix"), hero_config(data))
    whole_prefix = tmp_path_factory.mktemp("hero-uninterrupted")
    return resumed, run_whole(whole_prefix, hero_config(data)), next(whole_prefix.glob("train/tiny-moe-*"))


@pytest.mark.parametrize("optimizer", ["adamw", "hero"])
def test_a_resumed_run_has_the_uninterrupted_runs_losses(optimizer: str, request: pytest.FixtureRequest) -> None:
    # The claim behind resuming: weights, optimizer state (MuonH's momentum, AdamH's and Adam's moments under
    # hero), router bias and data order all come back. A resume at the right step with lost optimizer state or a
    # replayed batch would log other losses from there on.
    if optimizer == "adamw":
        killed, whole_run = request.getfixturevalue("killed_and_resumed"), request.getfixturevalue("uninterrupted")
    else:
        killed, whole_run, whole_path = request.getfixturevalue("hero_runs")
    resumed = dict(train_losses(killed["records"][killed["records_before"] :]))
    whole = dict(train_losses(whole_run))
    assert sorted(resumed) == list(range(killed["killed_at"][-1] + 1, STEPS))
    resumed_losses, whole_losses = [resumed[step] for step in sorted(resumed)], [whole[s] for s in sorted(resumed)]
    if optimizer == "hero":
        # Bit for bit: MuonH's momentum and the Adam moments come back exactly, and so do every loss after and
        # the final weights (the router bias among them).
        assert resumed_losses == whole_losses
        exports = [load_hf_export(str(path / HF_FOLDER)) for path in (killed["output_path"], whole_path)]
        for resumed_leaf, whole_leaf in zip(*(jax.tree.leaves(model) for model in exports), strict=True):
            assert np.array_equal(np.asarray(resumed_leaf), np.asarray(whole_leaf))
    else:
        assert resumed_losses == pytest.approx(whole_losses, rel=1e-5, abs=1e-5)
    groups = json.loads((killed["output_path"] / OPTIMIZER_GROUPS_FILE).read_text())
    assert groups["optimizer"] == optimizer
    expected = {"adamw"} if optimizer == "adamw" else {"muonh", "adamh", "adam"}
    assert set(groups["groups"].values()) == expected and groups["groups"]["lm_head.weight"] in ("adamw", "adamh")


def test_each_eval_step_is_evaluated_once(uninterrupted):
    """Evals every STEPS / 2 steps: at the middle step and the last. Levanter runs every hook once more after the
    last step (forced), which evaluated the final model a second time and logged its figures twice at one step."""
    evaluated = [record["step"] for record in uninterrupted if f"eval/{SOURCES[0]}/loss" in record]
    assert evaluated == [STEPS // 2 - 1, STEPS - 1], evaluated


def test_metrics_jsonl_holds_what_the_dashboard_plots(killed_and_resumed):
    keys = set().union(*(record.keys() for record in killed_and_resumed["records"]))
    for key in ("train/loss", "optim/learning_rate", "grad/norm/total", "params/norm/total",
                "throughput/tokens_per_second", "model_flops_per_second", "mfu"):  # fmt: skip
        assert key in keys, sorted(keys)
    assert {f"eval/{source}/loss" for source in SOURCES} <= keys, sorted(keys)
    output_path = killed_and_resumed["output_path"]
    assert list((output_path / "wandb").glob("**/*.wandb")), "wandb's offline run file is missing"
    # 40 steps: the watch is compiled into the one train step and logs every 5th step (`compile_once`), from
    # both the killed run and the resumed one.
    watched = {record["step"] for record in killed_and_resumed["records"] if "grad/norm/total" in record}
    assert watched == set(range(4, STEPS, 5)), sorted(watched)
    router = [record for record in killed_and_resumed["records"] if "router/bias/norm" in record]
    assert router and router[-1]["router/bias/norm"] > 0, "the router bias never moved"
    assert all(record["router/load/max_over_mean"] >= 1.0 for record in router)


def test_training_reads_the_caches_and_builds_none(killed_and_resumed):
    assert killed_and_resumed["caches_after"] == killed_and_resumed["caches_before"]


def tokens_per_byte(data: dict[str, str], source: str, tokens: int) -> float:
    """Predicted tokens over the UTF-8 bytes they decode to, for the first `tokens` tokens of the validation
    split, which is what an eval of that many tokens reads (special tokens decode to no bytes, as Levanter
    counts them)."""
    tokenizer = load_tokenizer(data["tokenizer"])
    cache = load_cache(f"{data[source]}/validation")
    stream = np.concatenate([row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))])[:tokens]
    return (len(stream) - 1) / len(tokenizer.decode(stream[1:].tolist(), skip_special_tokens=True).encode())


def test_evaluate_scores_the_final_checkpoint_as_the_train_steps_own_eval(data, killed_and_resumed, tmp_path):
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    output_path = killed_and_resumed["output_path"]
    config = EvaluateConfig(checkpoint_path=str(output_path / "checkpoints"), shape=tiny_shape(vocab),
                            tokenizer_path=data["tokenizer"], components={source: data[source] for source in SOURCES},
                            output_path=str(tmp_path / "eval-abc"), batch_size=8, max_batches=EVAL_BATCHES)  # fmt: skip
    results = evaluate(config)
    assert json.loads((tmp_path / "eval-abc" / "results.json").read_text()) == results
    assert results["step"] == checkpoint_steps(output_path)[-1]
    last_eval = [record for record in killed_and_resumed["records"] if f"eval/{SOURCES[0]}/loss" in record][-1]
    for source in SOURCES:
        figures = results["components"][source]
        assert figures["loss"] == pytest.approx(last_eval[f"eval/{source}/loss"], rel=1e-3), (figures, last_eval)
        assert figures["loss"] < train_losses(killed_and_resumed["records"])[0][1] - 0.5, "not better than untrained"
        evaluated_tokens = EVAL_BATCHES * 8 * config.shape.seq_len
        expected_bpb = figures["loss"] / math.log(2) * tokens_per_byte(data, source, evaluated_tokens)
        assert figures["bpb"] == pytest.approx(expected_bpb, rel=0.05), (figures, expected_bpb)
    losses = [results["components"][source]["loss"] for source in SOURCES]
    assert results["macro_loss"] == pytest.approx(float(np.mean(losses)))
    bpbs = [results["components"][source]["bpb"] for source in SOURCES]
    assert results["macro_bpb"] == pytest.approx(float(np.mean(bpbs)))
    assert bpbs[0] != pytest.approx(bpbs[1], rel=1e-3), "code and docstrings have different bytes per token"


def test_evaluate_with_a_capacity_counts_what_it_drops_and_scores_the_same_weights_dropless(
    data, killed_and_resumed, tmp_path
):
    """The run (trained dropless) scored with an expert capacity: half a fair share per sequence serves at most
    half of each sequence's copies (4 experts x 16 slots of 128), so at least half are dropped and the loss
    moves (this tiny model scores about as well without half its routed copies); room for every copy (factor
    experts / top-k: 64 slots) drops none and scores as dropless. Either way the `dropless` panel holds the
    plain evaluation's figures."""
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    fields = dict(checkpoint_path=str(killed_and_resumed["output_path"] / "checkpoints"), shape=tiny_shape(vocab),
                  tokenizer_path=data["tokenizer"], components={source: data[source] for source in SOURCES},
                  batch_size=8, max_batches=EVAL_BATCHES)  # fmt: skip
    plain = evaluate(EvaluateConfig(**fields, output_path=str(tmp_path / "plain")))
    half, roomy = (evaluate(EvaluateConfig(**fields, output_path=str(tmp_path / f"capacity-{factor}"),
                                           capacity_factor=factor)) for factor in (0.5, 2.0))  # fmt: skip
    assert "dropped_fraction" not in plain and "dropless" not in plain
    for results in (half, roomy):
        assert results["dropless"]["macro_loss"] == pytest.approx(plain["macro_loss"], rel=1e-6)
        for source in SOURCES:
            for figure in ("loss", "bpb"):
                dropless = results["dropless"]["components"][source][figure]
                assert dropless == pytest.approx(plain["components"][source][figure], rel=1e-6)
    assert half["capacity_factor"] == 0.5 and 0.5 <= half["dropped_fraction"] < 1
    for source in SOURCES:
        assert half["components"][source]["dropped_fraction"] >= 0.5
        assert half["components"][source]["loss"] != pytest.approx(plain["components"][source]["loss"], rel=1e-3)
        assert roomy["components"][source]["dropped_fraction"] == 0
        assert roomy["components"][source]["loss"] == pytest.approx(plain["components"][source]["loss"], rel=1e-5)
    assert roomy["dropped_fraction"] == 0


def test_evaluate_refuses_a_missing_checkpoint(data, tmp_path):
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    config = EvaluateConfig(checkpoint_path=str(tmp_path / "none"), shape=tiny_shape(vocab),
                            tokenizer_path=data["tokenizer"], components={SOURCES[0]: data[SOURCES[0]]},
                            output_path=str(tmp_path / "eval-xyz"))  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"evaluate step eval-xyz .*no complete checkpoint"):
        evaluate(config)
    assert not (tmp_path / "eval-xyz").exists()


def test_training_environment_is_offline_and_restored(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    with training_environment(str(tmp_path / "out")):
        assert os.environ["HF_HUB_OFFLINE"] == "1"
        assert os.environ["WANDB_DIR"] == str(tmp_path / "out" / "wandb")
        assert os.path.isdir(os.environ["MARIN_PREFIX"])
    assert "HF_HUB_OFFLINE" not in os.environ and "WANDB_DIR" not in os.environ


def test_one_training_environment_at_a_time_per_process(tmp_path):
    """The local backend runs steps in threads: a second run waits instead of switching the first one's
    process-wide settings (WANDB_DIR, Levanter's tracker) under it."""
    first_inside, second_inside, seen = threading.Event(), threading.Event(), []

    def second() -> None:
        first_inside.wait()
        with training_environment(str(tmp_path / "second")):
            second_inside.set()

    thread = threading.Thread(target=second)
    thread.start()
    with training_environment(str(tmp_path / "first")):
        first_inside.set()
        assert not second_inside.wait(1.0), "a second run entered while the first one ran"
        seen.append(os.environ["WANDB_DIR"])
    thread.join(timeout=30)
    assert second_inside.is_set() and seen == [str(tmp_path / "first" / "wandb")]


def test_a_runs_log_file_takes_no_lines_of_later_steps(tmp_path):
    """Levanter's trainer adds its run's log file to the root logger (`init_logging`) and keeps it: a Ray worker's
    later steps logged into the first train step's logs/ folder."""
    from levanter.utils.logging import init_logging

    logs = tmp_path / "out" / "logs"
    init_logging(logs, "run")  # what TrainerConfig.initialize does at the start of a run
    logging.getLogger("levanter").info("during the run")
    close_log_files(logs)  # what the train step does at its end
    logging.getLogger("levanter").info("a later step")
    text = (logs / "run.log").read_text()
    assert "during the run" in text and "a later step" not in text


def test_each_training_environment_gets_its_own_wandb_files(tmp_path, monkeypatch):
    """Two runs in one process (a Ray worker runs many steps): each run's offline wandb files land under its own
    output path, not under the first one's."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    for name in ("first", "second"):
        with training_environment(str(tmp_path / name)):
            run = wandb.init(project="p", id=f"run-{name}", name=name)
            run.finish()
        assert list((tmp_path / name / "wandb").glob(f"**/run-run-{name}.wandb")), name
        assert "WANDB_SERVICE" not in os.environ, "processes started from here would join this run's wandb service"
    assert not list((tmp_path / "first" / "wandb").glob("**/run-run-second.wandb"))


def test_bad_input_is_refused_before_any_compute(data, tmp_path):
    output_path = str(tmp_path / "train-bad-abc123")
    with pytest.raises(TrainInputError, match=r"train step train-bad-abc123 .*does not split"):
        check_inputs(train_config(data, output_path, train_batch_size=7, per_device_parallelism=2))
    missing = {"python_stdlib": data["python_stdlib"], "python_docstrings": str(tmp_path / "nowhere")}
    with pytest.raises(TrainInputError, match=r"train-bad-abc123.*'python_docstrings' has no Levanter cache"):
        check_inputs(train_config(data, output_path, components=missing))
    vocab = load_tokenizer(data["tokenizer"]).get_vocab_size()
    with pytest.raises(TrainInputError, match=rf"train-bad-abc123.*{vocab} tokens but the model shape says"):
        check_inputs(train_config(data, output_path, shape=tiny_shape(vocab + 1)))
    other_tokenizer = str(tmp_path / "tokenizer-256")
    corpus = data["python_stdlib"].replace("tokenized", "corpus")
    train_tokenizer(TrainTokenizerConfig(input_paths=[corpus], vocab_size=300, sample_bytes=100_000,
                                         output_path=other_tokenizer))  # fmt: skip
    other_vocab = load_tokenizer(other_tokenizer).get_vocab_size()
    with pytest.raises(TrainInputError, match=rf"tokenized with a {vocab}-token vocabulary.*has {other_vocab}"):
        check_inputs(train_config(data, output_path, tokenizer_path=other_tokenizer, shape=tiny_shape(other_vocab)))
    with pytest.raises(ValueError, match="top_k=5 exceeds n_experts=4"):
        tiny_shape(vocab, top_k=5)
    assert not os.path.exists(output_path), "a refused run must leave nothing behind"


def test_the_mixture_comes_from_a_per_cell_tokenize_output_and_a_two_phase_weights_file(data, tmp_path):
    """Components listed in components.json join the given ones; each phase of weights.json starts at its share of
    the steps (on a mixture block); a weighted cell that tokenize left out is dropped, an unweighted component
    gets 0 (validation only); a phase weighing none of the components is refused."""
    tokenized = tmp_path / "tokenized"
    tokenized.mkdir()
    (tokenized / "components.json").write_text(json.dumps({"components": {"cell_a": {}}, "excluded": {"cell_b": {}}}))
    weights = tmp_path / "weights"
    weights.mkdir()
    phases = [{"fraction": 0.8, "weights": {"cell_a": 0.5, "cell_b": 0.2, "python_stdlib": 0.3}},
              {"fraction": 0.2, "weights": {"cell_a": 0.9, "cell_b": 0.1}}]  # fmt: skip
    (weights / "weights.json").write_text(json.dumps({"phases": phases}))
    config = train_config(data, str(tmp_path / "train-mix"), components={"python_stdlib": data["python_stdlib"]},
                          components_path=str(tokenized), mixture_weights_path=str(weights), num_train_steps=50,
                          train_batch_size=8, mixture_block_size=16)  # fmt: skip
    components, schedule = data_mixture(config)
    assert components == {"python_stdlib": data["python_stdlib"], "cell_a": str(tokenized / "cell_a")}
    # 80% of 50 steps = step 40; 40 x 8 sequences is a whole number of 16-sequence blocks.
    assert schedule == [(0, {"python_stdlib": 0.3, "cell_a": 0.5}), (40, {"python_stdlib": 0.0, "cell_a": 0.9})]
    phases[1]["weights"] = {"cell_b": 1.0}
    (weights / "weights.json").write_text(json.dumps({"phases": phases}))
    with pytest.raises(TrainInputError, match=r"phase 2 of .*weights weighs none of the components"):
        data_mixture(config)
    with pytest.raises(TrainInputError, match=r"no weights.json under .*nowhere; run the mixture_weights step"):
        data_mixture(train_config(data, "x", mixture_weights_path=str(tmp_path / "nowhere")))


@pytest.mark.gcs
def test_a_run_under_a_gs_prefix_checkpoints_resumes_and_is_watchable(data, gcs_emulator, monkeypatch):
    """The production layout: the step's output on GCS (the emulator; tensorstore pointed at it). Levanter's
    OCDBT checkpoints and the HF export go to the bucket, metrics.jsonl goes as segments the dashboard reads,
    wandb's offline run and Levanter's log file are uploaded at the end, and a rerun after losing the last
    checkpoint resumes from the one before, adding to the metrics."""
    from executor import storage
    from steps.train.train import train

    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", os.environ["EXECUTOR_TEST_GCS_URL"])
    monkeypatch.delenv("WANDB_MODE")  # wandb as shipped: offline files, uploaded at the end (tests/conftest.py)
    output = f"{gcs_emulator}/train-{os.getpid()}-{time.monotonic_ns()}"
    config = train_config(data, output, num_train_steps=6, steps_per_eval=3, checkpoint_every_steps=3)
    train(config)
    stored = {name for name, _size in storage.walk_files(output)}
    assert {"checkpoints/step-3/metadata.json", "checkpoints/step-5/metadata.json"} <= stored
    assert {"hf/config.json", "hf/model.safetensors"} <= stored
    assert "metrics.jsonl.d/00000000.jsonl" in stored and "metrics.jsonl" not in stored
    # wandb and Levanter write local files only: their temporary folders are uploaded at the end.
    assert any(name.startswith("wandb/") and name.endswith(".wandb") for name in stored)
    assert any(name.startswith("logs/") and name.endswith(".log") for name in stored)
    first = train_losses(read_metrics(output))
    assert {step for step, _loss in first} == set(range(6))
    assert load_hf_export(f"{output}/{HF_FOLDER}").config.hidden_dim == config.shape.d_model

    storage.delete(f"{output}/checkpoints/step-5", recursive=True)  # as if killed before it was written
    train(config)  # resumes from step-3, the state after step 3: it logs steps 4 and 5 only
    again = train_losses(read_metrics(output))
    assert again[: len(first)] == first and {step for step, _loss in again[len(first) :]} == {4, 5}
    assert "metrics.jsonl.d/00000001.jsonl" in {name for name, _size in storage.walk_files(output)}


def test_short_runs_compile_one_train_step_with_the_watch_inside(data, tmp_path):
    """Levanter compiles a second train step for the steps its watch fires on; a short run compiles one."""
    from steps.train.train import COMPILE_ONCE_BELOW_STEPS, _watch

    watch = lambda **changes: _watch(train_config(data, str(tmp_path), **changes))  # noqa: E731
    assert (watch().interval, watch().log_interval) == (1, 5)
    long_run = watch(num_train_steps=COMPILE_ONCE_BELOW_STEPS)
    assert (long_run.interval, long_run.log_interval) == (5, None)
    assert watch(num_train_steps=COMPILE_ONCE_BELOW_STEPS, compile_once=True).log_interval == 5
    assert watch(compile_once=False).log_interval is None
    never_fires = watch(watch_interval=STEPS + 1)  # Levanter then compiles only the step without the watch
    assert (never_fires.interval, never_fires.log_interval) == (STEPS + 1, None)
