"""Planning semantics a training run bets on (issue 8): bare steps in configs, relative hard-coded
inputs, unambiguous version keys, merging identical steps, and where a Ray run may write."""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass

import pytest

from executor import (
    THIS_OUTPUT_PATH,
    ConfigError,
    Executor,
    ExecutorStep,
    InputName,
    ResourceConfig,
    RetryPolicy,
    UnversionableValueError,
    executor_main,
    output_path_of,
    versioned,
)
from executor.dag.identity import encode_value, readable_value
from executor.dag.plan import build_plan


@dataclass(frozen=True)
class Config:
    output_path: str = THIS_OUTPUT_PATH
    input_path: object = None
    lr: object = 0.1
    extra: object = None


@dataclass(frozen=True)
class Nested:
    source: object = None


def fn(config: Config) -> None:
    pass


def plan_of(*steps, prefix: str = "/prefix"):
    return build_plan(list(steps), prefix)


def here() -> int:
    """The caller's line number, to name a definition site in an expected error."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


# --- 1. a bare step inside a config is output_path_of(step) ---------------------------------


def test_a_bare_step_in_a_config_is_a_dependency_resolved_to_its_path():
    a = ExecutorStep("a", fn, Config(lr=versioned(1)))
    bare = ExecutorStep("b", fn, Config(input_path=a, extra={"list": [a], "nested": Nested(source=a)}))
    marked = ExecutorStep(
        "b",
        fn,
        Config(input_path=output_path_of(a), extra={"list": [output_path_of(a)], "nested": Nested(output_path_of(a))}),
    )
    plan = plan_of(bare)
    planned_a, planned_b = plan.lookup(a), plan.lookup(bare)
    assert [planned.name for planned in plan.steps] == ["a", "b"]  # the inner step is planned, first
    assert planned_b.blocking == [planned_a]
    assert planned_a.config.output_path == planned_a.output_path  # its own path, not the outer one's
    assert planned_b.config.input_path == planned_a.output_path
    assert planned_b.config.extra == {"list": [planned_a.output_path], "nested": Nested(planned_a.output_path)}
    assert planned_b.version == plan_of(marked).lookup(marked).version  # same identity as output_path_of
    assert "lr" not in json.dumps(planned_b.version)  # the inner step's values are not folded in


def test_run_accepts_input_names_as_marin_does():
    a = ExecutorStep("a", fn, Config(lr=versioned(1)))
    plan = plan_of(output_path_of(a))
    assert [planned.name for planned in plan.requested] == ["a"]
    with pytest.raises(ConfigError, match=r"hard-coded input 'gs://raw/x' is not a step"):
        plan_of(InputName.hardcoded("gs://raw/x"))


# --- 2. a relative hard-coded input lives under the prefix ----------------------------------


def test_relative_hardcoded_inputs_resolve_under_the_prefix_and_hash_prefix_free():
    step = ExecutorStep("s", fn, Config(input_path=InputName.hardcoded("raw/x")))
    local, remote = plan_of(step, prefix="/data/run").lookup(step), plan_of(step, prefix="gs://bucket/run").lookup(step)
    assert local.config.input_path == "/data/run/raw/x"
    assert remote.config.input_path == "gs://bucket/run/raw/x"
    assert local.version["config"] == {"input_path": "raw/x"} and local.hash == remote.hash
    spelled_otherwise = ExecutorStep("s", fn, Config(input_path=InputName.hardcoded("./raw/x/")))
    assert plan_of(spelled_otherwise).requested[0].hash == local.hash
    for fixed in ("/abs/raw/x", "gs://raw/x", "https://example.com/x.txt"):
        absolute = ExecutorStep("s", fn, Config(input_path=InputName.hardcoded(fixed)))
        assert plan_of(absolute, prefix="/data/run").lookup(absolute).config.input_path == fixed


# --- 3. version keys are unambiguous --------------------------------------------------------


def hash_of(extra: object) -> str:
    return plan_of(ExecutorStep("s", fn, Config(extra=extra))).requested[0].hash


def test_a_dotted_dict_key_never_collides_with_a_nested_one():
    base = hash_of({"x.y": versioned(1), "x": {"y": versioned(2)}})
    assert base != hash_of({"x.y": versioned(5), "x": {"y": versioned(2)}})
    assert base != hash_of({"x.y": versioned(1), "x": {"y": versioned(5)}})
    assert hash_of({"[0]": versioned(1)}) != hash_of([versioned(1)])
    assert hash_of({"{0}": versioned(1)}) != hash_of({versioned(1)})
    assert hash_of({"": versioned(1)}) != hash_of(versioned(1))
    version = plan_of(ExecutorStep("s", fn, Config(extra={"x.y": versioned(1), "plain": versioned(2)}))).requested[0]
    assert version.version["config"] == {'extra.["x.y"]': 1, "extra.plain": 2}  # ordinary keys read as before


def test_a_trailing_slash_does_not_make_another_dependency():
    a = ExecutorStep("a", fn, Config(lr=versioned(1)))
    with_slash = plan_of(ExecutorStep("b", fn, Config(input_path=output_path_of(a, "d/")))).requested[0]
    without = plan_of(ExecutorStep("b", fn, Config(input_path=output_path_of(a, "d")))).requested[0]
    dotted = plan_of(ExecutorStep("b", fn, Config(input_path=a / "./d//"))).requested[0]
    assert with_slash.hash == without.hash == dotted.hash
    assert with_slash.config.input_path == without.config.input_path == dotted.config.input_path
    assert without.version["config"] == {"input_path": "DEP[0]/d"}


# --- 4. merging identical steps keeps (or refuses to drop) their settings -------------------


def test_identical_steps_with_identical_settings_merge():
    a1 = ExecutorStep("a", fn, Config(lr=versioned(1)), resources=ResourceConfig(cpus=2), retry=RetryPolicy(5))
    a2 = ExecutorStep("a", fn, Config(lr=versioned(1)), resources=ResourceConfig(cpus=2), retry=RetryPolicy(5))
    merged = plan_of(a1, a2)
    assert merged.lookup(a1) is merged.lookup(a2)
    defaults = ExecutorStep("a", fn, Config(lr=versioned(1)), resources=ResourceConfig())
    plain = ExecutorStep("a", fn, Config(lr=versioned(1)))
    plan = plan_of(defaults, plain)  # no resources and default resources mean the same
    assert plan.lookup(defaults) is plan.lookup(plain)


@pytest.mark.parametrize(
    "setting",
    [
        {"override_output_path": "pinned/a"},
        {"resources": ResourceConfig(gpus=1)},
        {"retry": RetryPolicy(max_attempts=7)},
    ],
)
def test_identical_steps_with_conflicting_settings_name_both_definitions(setting):
    first, first_line = ExecutorStep("a", fn, Config(lr=versioned(1))), here()
    second, second_line = ExecutorStep("a", fn, Config(lr=versioned(1)), **setting), here()
    assert first.defined_at.endswith(f"test_plan.py:{first_line}")
    [name] = setting
    with pytest.raises(ConfigError) as raised:
        plan_of(ExecutorStep("b", fn, Config(input_path=first, extra=second)))
    message = str(raised.value)
    assert f"step 'a' (hash {plan_of(first).requested[0].short_hash}" in message and name in message
    assert f"test_plan.py:{first_line}" in message
    assert f"test_plan.py:{second_line}" in message


# --- one canonicalizer for versions and for the records people read -------------------------


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


def test_readable_configs_use_the_version_encoder_and_are_strict_json():
    data = {"b": [1, 2.5, None], "a": ("x", frozenset({3, 1}))}
    assert readable_value(data) == encode_value(data, "where")
    with pytest.raises(UnversionableValueError):
        encode_value({"x": Opaque()}, "where")
    readable = readable_value({"x": Opaque(), 2: math.nan, "s": {Opaque(), 1}})
    assert readable == {"x": "Opaque()", "2": "nan", "s": ["Opaque()", 1]}  # sets: by canonical JSON
    json.dumps(readable, allow_nan=False)  # what the dashboard's JSON.parse can read


# --- 9. a Ray cluster needs storage every node sees -----------------------------------------


def test_a_ray_cluster_with_a_local_disk_prefix_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head.example:10001")
    with pytest.raises(ConfigError, match=r"each node.*own disk.*--shared_filesystem true"):
        Executor(str(tmp_path), backend="ray")
    with pytest.raises(ConfigError, match="--shared_filesystem true"):
        Executor(f"file://{tmp_path}", backend="ray")
    Executor(str(tmp_path), backend="ray", shared_filesystem=True)  # an NFS mount, say: the user vouches
    Executor("gs://bucket/runs", backend="ray")
    Executor(str(tmp_path), backend="local")
    step = ExecutorStep("a", fn, Config(lr=versioned(1)))
    with pytest.raises(ConfigError, match="--shared_filesystem true"):
        executor_main([step], args=["--prefix", str(tmp_path), "--backend", "ray", "--dry_run", "true"])
    args = ["--prefix", str(tmp_path), "--backend", "ray", "--shared_filesystem", "true", "--dry_run", "true"]
    assert executor_main([step], args=args).shared_filesystem
    assert "Dry run: 1 step(s)" in capsys.readouterr().out
    monkeypatch.delenv("RAY_ADDRESS")
    Executor(str(tmp_path), backend="ray")  # a local Ray runs on this machine: one disk
