"""Claims about scheduling that no test held (issue 38 point 9): a transient failure's retry waits the policy's
backoff (initial, times the multiplier, capped), and `max_concurrent` caps the steps running at once, with the
cap actually reached. Waits are read from the status history the executor wrote, never from a clock."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

from conftest import CALLS
from test_executor import flaky_step

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, RetryPolicy, versioned
from executor.store.events import StepStatus, read_events


def test_retries_wait_the_policys_backoff_growing_and_capped(tmp_path, calls):
    policy = RetryPolicy(max_attempts=4, initial_backoff_s=0.5, multiplier=2.0, max_backoff_s=1.5)
    step = flaky_step(3, "conn", policy)
    executor = Executor(str(tmp_path))
    executor.run([step])
    events = read_events(executor.output_paths[step])
    waits = [float(re.search(r"retrying in ([0-9.]+)s", event.message).group(1))
             for event in events if event.status == StepStatus.WAITING and event.message]  # fmt: skip
    bases = [0.5, 1.0, 1.5]  # 0.5 x 2^k, the last capped at max_backoff_s (it would be 2.0)
    assert len(waits) == len(bases)
    for wait, base in zip(waits, bases, strict=True):
        assert 0.8 * base - 0.05 <= wait <= 1.2 * base + 0.05, (waits, bases)  # ±20% jitter, printed to 0.1 s
    assert events[-1].status == StepStatus.SUCCESS and calls.counts == {"fails_n_times": 4}


@dataclass(frozen=True)
class PairConfig:
    index: int
    output_path: str


RUNNING_NOW: list[int] = [0]
MOST_AT_ONCE: list[int] = [0]
CHANGED = threading.Condition()
HOLD_S = 3.0
"""How long each step stays running unless a third joins it: time enough for any step the cap let through to
start, so a run over the cap is seen (a third running) and one at the cap is too (two running)."""


def held(config: PairConfig) -> None:
    with CHANGED:
        RUNNING_NOW[0] += 1
        MOST_AT_ONCE[0] = max(MOST_AT_ONCE[0], RUNNING_NOW[0])
        CHANGED.notify_all()
        CHANGED.wait_for(lambda: RUNNING_NOW[0] > 2, timeout=HOLD_S)
        RUNNING_NOW[0] -= 1
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    CALLS.record("held")


def test_max_concurrent_caps_the_steps_running_at_once_and_is_reached(tmp_path, calls):
    steps = [ExecutorStep(f"held/{index}", held, PairConfig(versioned(index), THIS_OUTPUT_PATH))
             for index in range(6)]  # fmt: skip
    MOST_AT_ONCE[0] = 0
    Executor(str(tmp_path)).run(steps, max_concurrent=2)
    assert MOST_AT_ONCE[0] == 2 and calls.counts == {"held": 6}
