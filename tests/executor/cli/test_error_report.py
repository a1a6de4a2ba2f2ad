"""What a user sees when an experiment's command line fails on a mistake they can fix: the message and
their own frames, never a traceback through the executor; for a failed step, what the step raised and
logged, and that rerunning retries it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from paths import REPO

EXPERIMENT = """
import logging
from dataclasses import dataclass

from executor import THIS_OUTPUT_PATH, ExecutorStep, executor_main, versioned

logger = logging.getLogger("mine")


@dataclass(frozen=True)
class StatsConfig:
    source: str
    output_path: str


def count_docs(config: StatsConfig) -> None:
    logger.info("counting docs of %s", config.source)
    raise ValueError(f"no docs in {config.source}")


stats = ExecutorStep("mine/stats", count_docs, StatsConfig(versioned("corpus-v1"), THIS_OUTPUT_PATH))

if __name__ == "__main__":
    executor_main([stats], description="a newcomer's pipeline")
"""


def run_experiment(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "mine.py"
    script.write_text(textwrap.dedent(EXPERIMENT))
    command = [sys.executable, str(script), "--prefix", str(tmp_path / "outputs"), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def executor_frames(stderr: str) -> list[str]:
    package = str(REPO / "executor")
    return [line for line in stderr.splitlines() if line.strip().startswith("File ") and package in line]


def test_a_failed_step_shows_its_own_error_and_log_not_the_executors_frames(tmp_path):
    result = run_experiment(tmp_path)
    assert result.returncode == 1
    assert executor_frames(result.stderr) == [], result.stderr
    assert 'mine.py", line' in result.stderr  # the user's own frame stays
    assert "StepFailedError: 1 step(s) failed: mine/stats-" in result.stderr
    assert "raised (from its .executor_status)" in result.stderr
    assert "in count_docs" in result.stderr and "ValueError: no docs in corpus-v1" in result.stderr
    assert "counting docs of corpus-v1" in result.stderr.split("last lines of")[-1]  # the log's tail
    assert "Rerunning the same command retries the failed step(s)" in result.stderr


def test_a_config_error_is_its_message_without_the_executors_frames(tmp_path):
    result = run_experiment(tmp_path, "--force_run", "mine/stat_typo")
    assert result.returncode == 1
    assert executor_frames(result.stderr) == [], result.stderr
    assert "ConfigError: force_run pattern 'mine/stat_typo' matches no step" in result.stderr
    result = run_experiment(tmp_path, "--max_concurrent", "0")
    assert executor_frames(result.stderr) == [] and "max_concurrent must be at least 1" in result.stderr
