"""A train step's optimizer settings are refused when the DAG is planned (issue 38 point 1): before any step
runs, so no JAX compile, no checkpoint and no status is written; the error names the step, its hash and path,
and the setting."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_train import tiny_shape

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.errors import ConfigError
from steps.train.input_checks import TrainInputError
from steps.train.train import TrainConfig, check_inputs, train


def train_step(tmp_path: Path, **changes: object) -> ExecutorStep:
    """A train step on paths that need not exist: planning reads no storage."""
    fields: dict[str, object] = dict(shape=tiny_shape(512), tokenizer_path=str(tmp_path / "tokenizer"),
                                     components={"prose": str(tmp_path / "prose")}, output_path=THIS_OUTPUT_PATH,
                                     num_train_steps=versioned(40), train_batch_size=8)  # fmt: skip
    fields.update(changes)
    return ExecutorStep(name="train/tiny", fn=train, config=TrainConfig(**fields))  # type: ignore[arg-type]


BAD_SETTINGS = [
    ({"num_train_steps": versioned(-1)}, "num_train_steps=-1"),
    ({"num_train_steps": 0}, "num_train_steps=0"),
    ({"learning_rate": versioned(-0.01)}, "learning_rate=-0.01"),
    ({"learning_rate": math.nan}, "learning_rate=nan"),
    ({"learning_rate": math.inf}, "learning_rate=inf"),
    ({"learning_rate": 0.0}, "learning_rate=0.0"),
    ({"warmup": 80}, "warmup=80 steps is longer than the run (num_train_steps=40)"),
    ({"warmup": -0.1}, "warmup=-0.1"),
    ({"warmup": math.nan}, "warmup=nan"),
    ({"min_lr_ratio": 1.5}, "min_lr_ratio=1.5"),
    ({"weight_decay": -1.0}, "weight_decay=-1.0"),
]


@pytest.mark.parametrize(("changes", "expected"), BAD_SETTINGS)
def test_a_bad_schedule_is_refused_at_planning_naming_the_step_and_setting(tmp_path, changes, expected):
    prefix = tmp_path / "prefix"
    step = train_step(tmp_path, **changes)
    with pytest.raises(ConfigError) as raised:
        Executor(str(prefix)).run([step])
    message = str(raised.value)
    assert "step train/tiny (hash " in message and str(prefix / "train" / "tiny-") in message
    assert expected in message and "fix the step's config" in message
    assert "\n" not in message
    # Nothing ran: no output folder, no status, no checkpoint.
    assert not (prefix / "train").exists()


def test_a_dry_run_refuses_it_too_and_upstream_steps_are_not_run(tmp_path):
    prefix = tmp_path / "prefix"
    upstream = ExecutorStep(name="data/prose", fn=write_marker, config=MarkerConfig(THIS_OUTPUT_PATH))
    step = train_step(tmp_path, components={"prose": upstream}, learning_rate=math.nan)
    for dry_run in (True, False):
        with pytest.raises(ConfigError, match="learning_rate=nan"):
            Executor(str(prefix)).run([step], dry_run=dry_run)
    assert not list(prefix.glob("**/*")), "the upstream step ran (or something was written) before the refusal"


def test_every_bad_setting_is_named_in_one_message(tmp_path):
    step = train_step(tmp_path, num_train_steps=-1, learning_rate=-1.0)
    with pytest.raises(ConfigError) as raised:
        Executor(str(tmp_path / "prefix")).run([step])
    assert "num_train_steps=-1" in str(raised.value) and "learning_rate=-1.0" in str(raised.value)


def test_good_settings_plan_and_the_step_checks_them_again_when_run_by_hand(tmp_path):
    good = train_step(tmp_path, warmup=40, min_lr_ratio=0.0, weight_decay=0.0)
    Executor(str(tmp_path / "prefix")).run([good], dry_run=True)
    config = TrainConfig(shape=tiny_shape(512), tokenizer_path="unused", components={"prose": "unused"},
                         output_path=str(tmp_path / "by-hand"), num_train_steps=10, train_batch_size=8,
                         learning_rate=math.nan)  # fmt: skip
    with pytest.raises(TrainInputError, match=r"train step by-hand \(.*by-hand\): learning_rate=nan"):
        check_inputs(config)


@dataclass(frozen=True)
class MarkerConfig:
    output_path: str


def write_marker(config: MarkerConfig) -> None:
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    (Path(config.output_path) / "ran").write_text("yes")
