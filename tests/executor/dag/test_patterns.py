"""Step patterns are full-match regexes; a glob is refused with the regex it meant; an invalid regex is one
line; a `--force_run` that would discard checkpoints lists them and needs `--yes` or a typed answer (issue 38
point 4). Run through `Executor.run`, an experiment's command line and `python -m executor`."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_error_report import executor_frames

from executor import Executor
from executor.cli.commands import main as cli_main
from executor.errors import ConfigError
from executor.store.events import StepStatus, read_events

EXPERIMENT = """
from dataclasses import dataclass
from pathlib import Path

from executor import THIS_OUTPUT_PATH, ExecutorStep, executor_main, versioned


@dataclass(frozen=True)
class RunConfig:
    width: int
    output_path: str


def fake_train(config: RunConfig) -> None:
    # What a train step leaves: checkpoints a forced rerun would discard.
    for step in (10, 20, 9):
        folder = Path(config.output_path) / "checkpoints" / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / "metadata.json").write_text("{}")
    (Path(config.output_path) / "model").write_text("trained")


def fake_stats(config: RunConfig) -> None:
    (Path(config.output_path) / "stats").write_text("counted")


steps = [ExecutorStep(f"train/d{width}", fake_train, RunConfig(versioned(width), THIS_OUTPUT_PATH))
         for width in (768, 1024, 7168)]
steps += [ExecutorStep(f"{part}/stats", fake_stats, RunConfig(versioned(1), THIS_OUTPUT_PATH))
          for part in ("prose", "code")]

if __name__ == "__main__":
    executor_main(steps)
"""


@pytest.fixture
def experiment(tmp_path: Path):
    """The experiment script, run once to the end; returns a function running it again with flags."""
    script = tmp_path / "mine.py"
    script.write_text(textwrap.dedent(EXPERIMENT))

    def run(*flags: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(script), "--prefix", str(tmp_path / "outputs"), *flags]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, stdin=stdin)

    assert run().returncode == 0
    return run


def runs_of(tmp_path: Path, name: str) -> int:
    """How many times the step ran to SUCCESS (its status history survives a forced rerun's emptied folder)."""
    [output] = (tmp_path / "outputs").glob(f"{name}-*")
    return sum(event.status == StepStatus.SUCCESS for event in read_events(str(output)))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Error: " in line]


@pytest.mark.parametrize(
    ("pattern", "meant", "matches"),
    [("train/d7*", "train/d7.*", "train/d7168, train/d768"), ("*/stats", ".*/stats", "code/stats, prose/stats")],
)
def test_a_glob_is_refused_with_the_regex_it_meant_and_nothing_runs(experiment, tmp_path, pattern, meant, matches):
    for flags in (["--dry_run", "true"], []):
        result = experiment("--force_run", pattern, *flags)
        assert result.returncode == 1
        [line] = error_lines(result.stderr)
        assert f"force_run pattern {pattern!r} looks like a glob" in line
        assert f"did you mean {meant!r}; it matches {matches}" in line and "Nothing was run or written" in line
        assert executor_frames(result.stderr) == [], result.stderr
    assert [runs_of(tmp_path, name) for name in ("train/d768", "train/d7168", "prose/stats")] == [1, 1, 1]


def test_a_pattern_matches_the_whole_name_not_a_part(experiment, tmp_path):
    result = experiment("--force_run", "d7", "--yes")
    assert result.returncode == 1 and "force_run pattern 'd7' matches no step" in result.stderr
    result = experiment("--force_run", "prose/stats")
    assert result.returncode == 0, result.stderr
    assert [runs_of(tmp_path, name) for name in ("prose/stats", "code/stats")] == [2, 1]


def test_an_invalid_regex_is_one_line(experiment):
    result = experiment("--force_run", "train/(d768")
    assert result.returncode == 1
    [line] = error_lines(result.stderr)
    assert "force_run pattern 'train/(d768' is not a valid regex (missing ), unterminated subpattern" in line
    assert "Traceback (most recent call last)" not in result.stderr


def test_discarding_checkpoints_needs_yes_and_lists_them(experiment, tmp_path):
    [output] = (tmp_path / "outputs").glob("train/d768-*")
    result = experiment("--force_run", "train/d768")
    assert result.returncode == 1
    [line] = error_lines(result.stderr)
    assert f"would discard the checkpoints of 1 step(s): train/d768-{output.name[5:]} ({output}/checkpoints): " \
           "3 checkpoint(s): step-9, step-10, step-20" in line  # fmt: skip
    assert "Rerun with --yes" in line
    assert runs_of(tmp_path, "train/d768") == 1 and (output / "checkpoints" / "step-20").is_dir()
    dry = experiment("--force_run", "train/d768", "--dry_run", "true")
    assert dry.returncode == 0 and f"would discard train/d768-{output.name[5:]}" in dry.stdout
    result = experiment("--force_run", "train/d768", "--yes")
    assert result.returncode == 0, result.stderr
    assert runs_of(tmp_path, "train/d768") == 2
    assert "1 step(s) ran here" in result.stderr


def test_a_terminal_is_asked_and_only_yes_goes_on(experiment, tmp_path):
    for answer, code, runs in ((b"no\n", 1, 1), (b"yes\n", 0, 2)):
        primary, secondary = pty.openpty()
        os.write(primary, answer)
        result = experiment("--force_run", "train/d1024", stdin=secondary)
        os.close(secondary)
        os.close(primary)
        assert result.returncode == code, result.stderr
        assert "Discard them? Type yes to go on" in result.stdout
        assert runs_of(tmp_path, "train/d1024") == runs
    [output] = (tmp_path / "outputs").glob("train/d1024-*")
    assert (output / "checkpoints" / "step-20").is_dir()  # rewritten by the rerun


def test_the_python_api_refuses_a_glob_and_an_invalid_regex_as_config_errors(tmp_path):
    from test_executor import make_step

    steps = [make_step("train/d768"), make_step("train/d1024")]
    with pytest.raises(ConfigError, match=r"looks like a glob.*did you mean 'train/d.*'; it matches train/d1024"):
        Executor(str(tmp_path)).run(steps, run_only=["train/d*"])
    with pytest.raises(ConfigError, match=r"is not a valid regex \(unterminated character set"):
        Executor(str(tmp_path)).run(steps, run_only=["train/[d"])


def test_the_cli_filters_by_whole_name_and_refuses_a_glob_in_one_line(experiment, tmp_path, capsys):
    prefix = str(tmp_path / "outputs")
    assert cli_main(["status", prefix, "--name", "train/d7.*"]) == 0
    shown = capsys.readouterr().out
    assert "train/d768" in shown and "train/d7168" in shown and "train/d1024" not in shown
    assert cli_main(["status", prefix, "--name", "d7"]) == 1  # no step is named d7
    capsys.readouterr()
    assert cli_main(["status", prefix, "--name", "train/*"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "did you mean 'train/.*'" in error
    assert cli_main(["explain", prefix, "(train"]) == 2
    assert "is not a valid regex" in capsys.readouterr().err
