"""A run whose figures go non-finite, written by the train step's own tracker (steps/train/train_metrics.py).

The step logs through Levanter's tracker API (`levanter.tracker.log`, the call its trainer and its eval callback
make) into the train step's `JsonlMetricsConfig` tracker, with JAX scalars as Levanter hands them over: a gradient
norm that becomes +inf at GRAD_INF_STEP, an eval loss that becomes NaN at EVAL_NAN_STEP (Levanter's eval callback
logs `eval/<component>/loss` and `eval/macro_loss`), and a router statistic at -inf at ROUTER_STEP. The train loss
stays finite, as it must for Levanter not to stop the run (`crash_on_nan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import levanter.tracker

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from steps.train.train_metrics import JsonlMetricsConfig

STEPS = 40
GRAD_INF_STEP = 12
EVAL_NAN_STEP = 20
ROUTER_STEP = 25
EVAL_EVERY = 10


@dataclass(frozen=True)
class NonfiniteRunConfig:
    output_path: str
    steps: int = versioned(STEPS)


def nonfinite_run(config: NonfiniteRunConfig) -> None:
    tracker = JsonlMetricsConfig(output_path=config.output_path, flops_per_token=1.0, devices=1).init(None)
    with levanter.tracker.current_tracker(tracker):
        for step in range(config.steps):
            grad = jnp.inf if step == GRAD_INF_STEP else 1.0 + 0.01 * step
            router = -jnp.inf if step == ROUTER_STEP else 1.5
            levanter.tracker.log({"train/loss": jnp.float32(6.0 - 0.05 * step), "grad/norm/total": jnp.float32(grad),
                                  "router/load/max_over_mean": jnp.float32(router),
                                  "optim/learning_rate": jnp.float32(3e-4)}, step=step)  # fmt: skip
            if step % EVAL_EVERY == 0:
                loss = jnp.nan if step == EVAL_NAN_STEP else 5.0 - 0.01 * step
                levanter.tracker.log({"eval": {"cell_a": {"loss": jnp.float32(loss)}, "macro_loss": jnp.float32(loss)}},
                                     step=step)  # fmt: skip
    tracker.finish()


def build_nonfinite_prefix(prefix: Path) -> str:
    """Run the one-step DAG; returns the run's output path relative to the prefix."""
    step = ExecutorStep(
        name="train/nonfinite", fn=nonfinite_run, config=NonfiniteRunConfig(output_path=THIS_OUTPUT_PATH)
    )
    executor = Executor(str(prefix))
    executor.run([step], caller="experiments/nonfinite.py", description="a run whose figures go non-finite")
    return executor.output_paths[step][len(str(prefix)) + 1 :]
