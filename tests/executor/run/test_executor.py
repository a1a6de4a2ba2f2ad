"""Running DAGs with the local backend: what runs, what is skipped, what fails, what is written."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CALLS, WriteConfig, make_step, write_text

from executor import (
    THIS_OUTPUT_PATH,
    ConfigError,
    Executor,
    ExecutorStep,
    StepFailedError,
    output_path_of,
    read_status,
    storage,
    versioned,
)
from executor.retry import DEFAULT_RETRY, RetryPolicy
from executor.store.events import read_events


def run(prefix, steps, **kwargs) -> Executor:
    executor = Executor(str(prefix))
    executor.run(steps, **kwargs)
    return executor


def test_a_dag_runs_in_dependency_order_and_writes_its_records(tmp_path, calls):
    a = make_step("a", text="A")
    b = make_step("b", a, text="B")
    c = make_step("c", a, b, text="C")
    executor = run(tmp_path, [c])
    out = Path(executor.output_paths[c])
    assert (out / "out.txt").read_text() == "C+A+B+A"
    assert calls.counts == {"a": 1, "b": 1, "c": 1}
    for step in (a, b, c):
        path = executor.output_paths[step]
        assert read_status(path) == "SUCCESS"
        assert [e.status for e in read_events(path)] == ["WAITING", "RUNNING", "SUCCESS"]
    info = json.loads((out / ".executor_info").read_text())
    assert info["name"] == "c" and info["version"] == executor.versions[c]
    assert info["config"]["inputs"][0] == executor.output_paths[a] + "/out.txt"
    assert {dep["name"] for dep in info["dependencies"]} == {"a", "b"}
    manifest = json.loads((out / ".executor_manifest").read_text())
    assert [entry["path"] for entry in manifest["files"]] == ["out.txt"]
    experiment = json.loads(Path(executor.executor_info_path).read_text())
    assert [step["name"] for step in experiment["steps"]] == ["a", "b", "c"]
    assert executor.executor_info_path.startswith(str(tmp_path / "experiments"))


def test_a_second_run_skips_everything(tmp_path, calls):
    c = make_step("c", make_step("b", make_step("a")))
    run(tmp_path, [c])
    run(tmp_path, [c])
    assert calls.counts == {"a": 1, "b": 1, "c": 1}


def test_run_only_runs_matches_and_their_dependencies(tmp_path, calls):
    a = make_step("data/a")
    b = make_step("data/b", a)
    c = make_step("train", b)
    other = make_step("eval")
    executor = run(tmp_path, [c, other], run_only=[".*b"])
    assert calls.counts == {"data/a": 1, "data/b": 1}
    assert read_status(executor.output_paths[c]) is None


def test_a_deleted_dependency_is_rebuilt_only_when_an_unfinished_step_needs_it(tmp_path, calls):
    a = make_step("a")
    b = make_step("b", a)
    c = make_step("c", b)
    executor = run(tmp_path, [c])
    shutil.rmtree(executor.output_paths[a])  # freed to save space once b had read it
    run(tmp_path, [c], run_only=["^b$"])
    run(tmp_path, [c])
    again = run(tmp_path, [c], force_run=["^c$"])
    assert calls.counts == {"a": 1, "b": 1, "c": 2}
    assert [(decision.planned.name, decision.action) for decision in again.decisions] == [("b", "skip"), ("c", "run")]
    shutil.rmtree(executor.output_paths[b])
    run(tmp_path, [c], run_only=["^b$"])  # b is unfinished now, and it needs a
    assert calls.counts == {"a": 2, "b": 2, "c": 2}


def test_a_selection_pattern_matching_no_step_is_an_error_before_anything_is_written(tmp_path, calls):
    train = make_step("train", make_step("data"))
    evaluate = make_step("eval_loss")
    with pytest.raises(ConfigError, match=r"run_only pattern 'trian' matches no step.*closest step names: train"):
        run(tmp_path / "out", [train, evaluate], run_only=["trian"])
    with pytest.raises(ConfigError, match=r"force_run pattern 'eval_los\$' matches no step.*closest.*: eval_loss"):
        run(tmp_path / "out", [train, evaluate], force_run=["^train$", "eval_los$"])
    with pytest.raises(ConfigError, match=r"force_run pattern '\^data\$' matches no step selected by this run"):
        run(tmp_path / "out", [train, evaluate], run_only=["eval.*"], force_run=["^data$"])
    assert not (tmp_path / "out").exists() and calls.counts == {}


def test_max_concurrent_below_one_is_an_error_before_anything_is_written(tmp_path, calls):
    for bad in (0, -2):
        with pytest.raises(ValueError, match=f"max_concurrent must be at least 1, got {bad}"):
            run(tmp_path / "out", [make_step("a")], max_concurrent=bad)
    assert not (tmp_path / "out").exists() and calls.counts == {}


@dataclass(frozen=True)
class SourcesConfig:
    output_path: str
    sources: list


def concatenate(config: SourcesConfig) -> None:
    CALLS.record("concatenate")
    parts = [Path(source, "out.txt").read_text() for source in config.sources]
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    Path(config.output_path, "out.txt").write_text("+".join(parts))


def test_a_bare_step_in_a_config_runs_first_and_arrives_as_its_path(tmp_path, calls):
    a, b = make_step("a", text="A"), make_step("b", text="B")
    both = ExecutorStep("both", concatenate, SourcesConfig(THIS_OUTPUT_PATH, sources=[a, b]))
    executor = Executor(str(tmp_path))
    executor.run([output_path_of(both)])  # an InputName is accepted where a step is, as in Marin
    assert calls.counts == {"a": 1, "b": 1, "concatenate": 1}
    assert Path(executor.output_paths[both], "out.txt").read_text() == "A+B"
    assert executor.configs[both].sources == [executor.output_paths[a], executor.output_paths[b]]


def test_force_run_reruns_a_successful_step_only(tmp_path, calls):
    b = make_step("b", make_step("a"))
    run(tmp_path, [b])
    executor = run(tmp_path, [b], force_run=["^b$"])
    assert calls.counts == {"a": 1, "b": 2}
    assert [e.status for e in read_events(executor.output_paths[b])][-2:] == ["RUNNING", "SUCCESS"]


def test_a_failure_stops_its_dependents_but_not_other_branches(tmp_path, calls):
    bad = make_step("bad", fail=True)
    child = make_step("child", bad)
    grandchild = make_step("grandchild", child)
    good = make_step("good")
    with pytest.raises(StepFailedError) as raised:
        executor = Executor(str(tmp_path))
        executor.run([grandchild, good])
    message = str(raised.value)
    assert message.startswith("1 step(s) failed: bad-")
    assert "RuntimeError: bad was told to fail" in message
    assert "DEP_FAILED" in message and "child-" in message and "grandchild-" in message
    assert raised.value.failed[0].startswith("bad-") and len(raised.value.dep_failed) == 2
    assert calls.counts == {"bad": 1, "good": 1}
    assert read_status(executor.output_paths[good]) == "SUCCESS"
    assert read_status(executor.output_paths[bad]) == "FAILED"
    assert read_status(executor.output_paths[child]) == "DEP_FAILED"
    assert read_status(executor.output_paths[grandchild]) == "DEP_FAILED"
    failed_event = read_events(executor.output_paths[bad])[-1]
    assert "Traceback" in failed_event.details["traceback"] and failed_event.attempt == 1
    log = Path(executor.output_paths[bad], "logs", "step.log").read_text()
    assert "bad was told to fail" in log
    assert not Path(executor.output_paths[bad], ".executor_manifest").exists()


def test_failed_steps_rerun_by_default_and_refuse_when_asked(tmp_path, calls):
    bad = make_step("bad", fail=True)
    with pytest.raises(StepFailedError):
        run(tmp_path, [bad])
    with pytest.raises(StepFailedError, match=r"^1 step\(s\) failed previously.*--force_run_failed true"):
        run(tmp_path, [bad], force_run_failed=False)
    assert calls.counts == {"bad": 1}  # refusing ran nothing
    with pytest.raises(StepFailedError, match=r"^1 step\(s\) failed: bad-"):
        run(tmp_path, [bad])  # force_run_failed=True is the default
    assert calls.counts == {"bad": 2}
    events = read_events(run(tmp_path, [bad], dry_run=True).output_paths[bad])
    assert [e.attempt for e in events if e.status == "RUNNING"] == [1, 2]


@dataclass(frozen=True)
class FlakyConfig:
    output_path: str
    fixed_marker: str


def flaky(config: FlakyConfig) -> None:
    CALLS.record("flaky")
    if not os.path.exists(config.fixed_marker):
        raise RuntimeError("not fixed yet")
    os.makedirs(config.output_path, exist_ok=True)
    Path(config.output_path, "out.txt").write_text("ok")


def test_a_fixed_failure_succeeds_on_rerun_and_dependents_resume(tmp_path, calls):
    marker = tmp_path / "fixed"
    first = ExecutorStep("flaky", flaky, FlakyConfig(THIS_OUTPUT_PATH, str(marker)))
    downstream = ExecutorStep(
        "downstream",
        write_text,
        WriteConfig(name="downstream", output_path=THIS_OUTPUT_PATH, inputs=(output_path_of(first, "out.txt"),)),
    )
    after = make_step("after")
    with pytest.raises(StepFailedError):
        run(tmp_path, [downstream, after])
    marker.write_text("")
    executor = run(tmp_path, [downstream, after])
    assert calls.counts == {"flaky": 2, "after": 1, "downstream": 1}
    history = [e.status for e in read_events(executor.output_paths[downstream])]
    assert history == ["WAITING", "DEP_FAILED", "RUNNING", "SUCCESS"]


def test_pseudo_dependencies_are_hashed_but_not_run(tmp_path, calls):
    pseudo = make_step("pseudo")
    user = make_step("user", nonblocking=[pseudo])
    executor = run(tmp_path, [user])
    assert calls.counts == {"user": 1}
    assert read_status(executor.output_paths[pseudo]) is None
    assert executor.versions[user]["dependencies"] == [f"pseudo-{executor.plan.lookup(pseudo).hash}"]
    run(tmp_path, [user, pseudo])  # asked for explicitly: it runs
    assert calls.counts == {"user": 1, "pseudo": 1}


def test_a_pseudo_dependency_runs_when_another_step_blocks_on_it(tmp_path, calls):
    shared = make_step("shared")
    pseudo_user = make_step("pseudo_user", nonblocking=[shared])
    blocking_user = make_step("blocking_user", shared)
    run(tmp_path, [pseudo_user, blocking_user])
    assert calls.counts == {"shared": 1, "pseudo_user": 1, "blocking_user": 1}


def test_dry_run_writes_nothing_and_says_why(tmp_path, calls, capsys):
    b = make_step("b", make_step("a"))
    executor = Executor(str(tmp_path / "out"))
    executor.run([b], dry_run=True)
    assert not (tmp_path / "out").exists()
    assert calls.counts == {}
    printed = capsys.readouterr().out
    assert "run   a-" in printed and "no output yet" in printed and executor.output_paths[b] in printed
    assert executor.versions[b]["name"] == "b" and executor.executor_info_path is not None
    run(tmp_path / "out", [b])
    before = sorted(str(p) + str(p.stat().st_mtime_ns) for p in (tmp_path / "out").rglob("*"))
    Executor(str(tmp_path / "out")).run([b], dry_run=True)
    assert "skip  b-" in capsys.readouterr().out
    after = sorted(str(p) + str(p.stat().st_mtime_ns) for p in (tmp_path / "out").rglob("*"))
    assert before == after


def test_relative_prefix_is_made_absolute_and_logged(tmp_path, monkeypatch, caplog, calls):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO):
        executor = Executor("rel/outputs")
    assert executor.prefix == str(tmp_path / "rel" / "outputs")
    assert "is relative; using the absolute path" in caplog.text


def test_memory_prefix_runs_the_same_dag_with_the_same_hashes(tmp_path, calls):
    c = make_step("c", make_step("b", make_step("a", text="A"), text="B"), text="C")
    prefix = "memory://test-memory-prefix"
    try:
        executor = run(prefix, [c])
        output = executor.output_paths[c]
        assert output.startswith("memory://test-memory-prefix/c-")
        assert storage.read_text(output + "/out.txt") == "C+B+A"
        assert read_status(output) == "SUCCESS"
        run(prefix, [c])
        assert calls.counts == {"a": 1, "b": 1, "c": 1}
        local = run(tmp_path, [c], dry_run=True)
        assert local.versions[c] == executor.versions[c]
        assert local.output_paths[c].rsplit("/", 1)[1] == output.rsplit("/", 1)[1]
    finally:
        storage.delete(prefix, recursive=True)


def test_unknown_backend_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown backend 'slurm'; choose one of local, ray"):
        Executor(str(tmp_path), backend="slurm")
    with pytest.raises(ValueError, match="Ray workers cannot see"):
        Executor("memory://x", backend="ray")


@dataclass(frozen=True)
class FlakyTimesConfig:
    output_path: str
    failures: int
    error: str


FAILURES_SEEN: dict[str, int] = {}


def fails_n_times(config: FlakyTimesConfig) -> None:
    seen = FAILURES_SEEN.get(config.output_path, 0)
    CALLS.record("fails_n_times")
    if seen < config.failures:
        FAILURES_SEEN[config.output_path] = seen + 1
        error = {"timeout": TimeoutError, "conn": ConnectionResetError, "value": ValueError}[config.error]
        raise error(f"failure {seen + 1}")
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    Path(config.output_path, "out.txt").write_text("ok")


def flaky_step(failures: int, error: str, retry: RetryPolicy | None = None) -> ExecutorStep:
    config = FlakyTimesConfig(THIS_OUTPUT_PATH, versioned(failures), versioned(error))
    return ExecutorStep(f"flaky_{error}", fails_n_times, config, retry=retry)


FAST = dataclasses.replace(DEFAULT_RETRY, initial_backoff_s=0.01)  # the default policy, without the waits


def test_transient_failures_are_retried_with_the_attempts_in_the_history(tmp_path, calls):
    step = flaky_step(2, "conn", FAST)
    executor = run(tmp_path, [step])
    history = [(event.status, event.attempt) for event in read_events(executor.output_paths[step])]
    assert history == [
        ("WAITING", 0), ("RUNNING", 1), ("WAITING", 1), ("RUNNING", 2), ("WAITING", 2), ("RUNNING", 3),
        ("SUCCESS", 3),
    ]  # fmt: skip
    retried = read_events(executor.output_paths[step])[2]
    assert "attempt 1 failed (transient): ConnectionResetError: failure 1; retrying in" in retried.message
    with pytest.raises(StepFailedError, match="TimeoutError: failure 3"):
        run(tmp_path, [flaky_step(5, "timeout", FAST)])  # three attempts, then FAILED
    assert calls.counts == {"fails_n_times": 6}


def test_application_errors_are_retried_only_when_the_step_opts_in(tmp_path, calls):
    with pytest.raises(StepFailedError, match="ValueError: failure 1"):
        run(tmp_path, [flaky_step(1, "value", FAST)])
    assert calls.counts == {"fails_n_times": 1}
    opted_in = flaky_step(1, "value", RetryPolicy(initial_backoff_s=0.01, retry_on=(ValueError,)))
    executor = run(tmp_path / "opted", [opted_in])
    assert read_status(executor.output_paths[opted_in]) == "SUCCESS"
    assert calls.counts == {"fails_n_times": 3}
