"""The `hero_run` fixture: `make demo`'s DAG (experiments/hero_535b.py --scale tiny on a local Ray), run once
per test session and shared by the tests that read its outputs (tests/e2e/test_hero_tiny.py, the dashboard's views).

The first run is SIGKILLed (the driver and every process of the local Ray it started) once the first train step
has a complete checkpoint before its last step; the second run finishes the DAG, resuming that train step; the
third must skip every step; a fourth forces one step (the hero's evaluation) to run again. Everything any test
reads is recorded here.

Each run gets a temp folder of its own (TMPDIR, which also holds its local Ray's sessions): every process of that
run, the driver, Ray's daemons and its workers, inherits it, which is how the kill finds them all and nothing
else (Ray's workers rename themselves `ray::...`, and its daemons leave the driver's process group).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from paths import with_wandb_as_shipped
from run_processes import end_run, run_demo, start_demo

KILL_IN = "train/d768"
TIMEOUT_S = 2400


@dataclass
class HeroRun:
    prefix: Path
    outputs: dict[str, Path]
    """Step name -> output folder (as the final run planned them)."""
    killed_step: Path
    killed_at: list[int]
    """The killed train step's complete checkpoints when it was killed."""
    cache_files_at_kill: dict[str, tuple[int, float]]
    resumed_output: str
    rerun_output: str
    forced_output: str
    """A fourth run with `--force_run ["evaluate/d6144"]`."""
    evaluated_before_force: str
    """evaluate/d6144's results.json as the second run wrote it, before the fourth ran the step again."""


def checkpoint_steps(output_path: Path) -> list[int]:
    """Steps of the complete checkpoints (Levanter writes metadata.json last)."""
    complete = output_path.glob("checkpoints/step-*/metadata.json")
    return sorted(int(path.parent.name.removeprefix("step-")) for path in complete)


def files_under(folder: Path) -> dict[str, tuple[int, float]]:
    return {str(path): (path.stat().st_size, path.stat().st_mtime) for path in folder.rglob("*") if path.is_file()}


def _run_to_end(prefix: Path, log: Path, *args: str) -> str:
    code, _seconds, text = run_demo(prefix, log, *args, env=with_wandb_as_shipped(os.environ), timeout_s=TIMEOUT_S)
    assert code == 0, f"the tiny hero DAG failed (exit {code}); end of {log}:\n{text[-4000:]}"
    return text


def _kill_mid_training(prefix: Path, log: Path) -> tuple[Path, list[int], dict[str, tuple[int, float]]]:
    with open(log, "ab") as out:
        process, temp = start_demo(prefix, out, env=with_wandb_as_shipped(os.environ))
    deadline = time.monotonic() + TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        trained = list(prefix.glob(f"{KILL_IN}-*"))
        steps = checkpoint_steps(trained[0]) if trained else []
        if steps and steps[-1] > 0:
            # The driver's local Ray outlives its process group, and its worker would finish the step on its own
            # (on a fast machine, before any rerun): kill the whole run.
            end_run(temp)
            process.wait()
            caches = files_under(next(prefix.glob("tokenized/cells-*")))
            return trained[0], checkpoint_steps(trained[0]), caches
        time.sleep(0.1)
    end_run(temp)
    raise AssertionError(f"{KILL_IN} never wrote a checkpoint before the run ended; end of {log}:\n"
                         f"{log.read_text(errors='replace')[-4000:]}")  # fmt: skip


@pytest.fixture(scope="session")
def hero_run(tmp_path_factory: pytest.TempPathFactory) -> HeroRun:
    prefix = tmp_path_factory.mktemp("hero-tiny")
    log = prefix.parent / f"{prefix.name}.log"
    killed_step, killed_at, caches = _kill_mid_training(prefix, log)
    resumed = _run_to_end(prefix, log)
    rerun = _run_to_end(prefix, log)
    evaluated = next(prefix.glob("evaluate/d6144-*/results.json")).read_text()
    forced = _run_to_end(prefix, log, "--force_run", '["evaluate/d6144"]')
    outputs = {}
    for status in prefix.rglob(".executor_status"):
        folder = status.parent
        name = str(folder.relative_to(prefix)).rsplit("-", 1)[0]
        outputs[name] = folder
    return HeroRun(prefix=prefix, outputs=outputs, killed_step=killed_step, killed_at=killed_at,
                   cache_files_at_kill=caches, resumed_output=resumed,
                   rerun_output=rerun, forced_output=forced, evaluated_before_force=evaluated)  # fmt: skip
