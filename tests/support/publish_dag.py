"""A small real DAG for the publish and alert tests, run with the real executor on a local prefix.

    data/corpus ──> train/healthy      a run whose loss falls smoothly: no alert may fire
                └─> train/faulty       the same run with a NaN loss at steps 30-31 and a 4x loss spike at step 60

Each run writes the train step's metrics lines (`train/loss`, `grad/norm/total`, throughput, router load,
`time`), a log line holding a secret, and carries a plain config value with a secret key and an absolute
path outside the prefix, so the tests can check that the published site shows the figures and none of those.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import wait_until

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, versioned
from executor.store.events import read_status
from executor.store.layout import METRICS_FILE

logger = logging.getLogger(__name__)
logger.setLevel(logging.INFO)

SECRET = "hunter2-do-not-publish"
LOG_SECRET = "a log line that must stay private"
START_TIME = 1_700_000_000.0


@dataclass(frozen=True)
class CorpusConfig:
    output_path: str
    docs: int = versioned(10)


def corpus(config: CorpusConfig) -> None:
    Path(config.output_path, "docs.jsonl").write_text("".join(json.dumps({"id": n}) + "\n" for n in range(config.docs)))


def metrics_line(step: int, *, loss: float | None = None, time_s: float | None = None) -> dict[str, object]:
    """A healthy run's figures at `step` (deterministic: a falling loss with a small wobble)."""
    wobble = 0.01 * math.sin(step * 1.7)
    return {
        "step": step,
        "time": START_TIME + 2.0 * step if time_s is None else time_s,
        "train/loss": 8.0 * (step + 10) ** -0.3 + wobble if loss is None else loss,
        "grad/norm/total": 1.0 + 0.05 * math.cos(step),
        "throughput/tokens_per_second": 1000.0 + 20 * math.sin(step),
        "router/load/max_over_mean": 1.5,
        "router/dropped_fraction": 0.05,
    }


@dataclass(frozen=True)
class FakeRunConfig:
    """Writes a run's metrics lines like the train step does (steps/train/train_metrics.py)."""

    output_path: str
    corpus_path: str
    steps: int = versioned(80)
    faults: bool = versioned(False)
    api_token: str = SECRET
    """A plain value with a secret key: the site must not show it."""
    scratch_dir: str = "/home/someone/private/scratch"
    """An absolute path of the machine outside the prefix: the site shows only its last part."""


def fake_run(config: FakeRunConfig) -> None:
    logger.info("%s (%s)", LOG_SECRET, config.api_token)
    lines = []
    for step in range(config.steps):
        line = metrics_line(step)
        if config.faults and step in (30, 31):
            line["train/loss"] = math.nan
        if config.faults and step == 60:
            line["train/loss"] = 4 * float(line["train/loss"])  # type: ignore[arg-type]
        lines.append(json.dumps(line))
    Path(config.output_path, METRICS_FILE).write_text("\n".join(lines) + "\n")


STALL_GATES: dict[str, threading.Event] = {}
"""Events that `train/stalled` steps wait on (after their last metrics line), by gate name."""


@dataclass(frozen=True)
class StalledRunConfig:
    """Writes a few metrics lines, then hangs (its lease kept live by the executor) until its gate opens."""

    output_path: str
    gate: str = versioned("stall")
    steps: int = 20
    quiet_s: float = 0.0
    """How long ago its last line was written (one second a step before that)."""
    times: str = "fixed"
    """"fixed": metrics_line's own, from START_TIME (long ago); "now": its lines' times end `quiet_s` ago."""


def stalled_run(config: StalledRunConfig) -> None:
    end = time.time() - config.quiet_s
    stamp = {step: end - (config.steps - 1 - step) if config.times == "now" else None for step in range(config.steps)}
    lines = "".join(json.dumps(metrics_line(step, time_s=stamp[step])) + "\n" for step in range(config.steps))
    partial = Path(config.output_path, METRICS_FILE + ".partial")
    partial.write_text(lines)
    partial.rename(Path(config.output_path, METRICS_FILE))  # whole once it exists: `running_step` waits for that
    STALL_GATES[config.gate].wait(timeout=300)


@contextlib.contextmanager
def running_step(prefix: Path, gate: str, name: str, **settings: Any) -> Iterator[tuple[str, str]]:
    """A `stalled_run` step RUNNING under `prefix` in a thread, held at `gate` until the block ends: its output path
    and that path relative to the prefix, once it has written metrics."""
    STALL_GATES[gate] = threading.Event()
    step = ExecutorStep(
        name=name, fn=stalled_run, config=StalledRunConfig(THIS_OUTPUT_PATH, versioned(gate), **settings)
    )
    executor = Executor(str(prefix))
    caller = f"experiments/{name.rsplit('/', 1)[-1]}.py"
    runner = threading.Thread(target=executor.run, args=([step],), kwargs={"caller": caller})
    runner.start()
    try:
        wait_until(lambda: step in executor.output_paths, "the step to be planned")
        output_path = executor.output_paths[step]
        wait_until(lambda: Path(output_path, METRICS_FILE).exists() and read_status(output_path) == "RUNNING", "a run")
        yield output_path, Path(output_path).relative_to(prefix).as_posix()
    finally:
        STALL_GATES[gate].set()
        runner.join(timeout=120)


def publish_steps() -> dict[str, ExecutorStep]:
    data = ExecutorStep(name="data/corpus", fn=corpus, config=CorpusConfig(output_path=THIS_OUTPUT_PATH))
    runs = {
        name: ExecutorStep(
            name=f"train/{name}",
            fn=fake_run,
            config=FakeRunConfig(
                output_path=THIS_OUTPUT_PATH, corpus_path=output_path_of(data), faults=versioned(name == "faulty")
            ),
        )
        for name in ("healthy", "faulty")
    }
    return {"data": data, **runs}


def build_publish_prefix(prefix: Path) -> dict[str, str]:
    """Run the DAG; returns each step's output path relative to the prefix, by key."""
    steps = publish_steps()
    executor = Executor(str(prefix))
    executor.run(list(steps.values()), caller="experiments/publish_demo.py", description="the publish test DAG")
    return {key: executor.output_paths[step][len(str(prefix)) + 1 :] for key, step in steps.items()}
