"""`make demo` as a newcomer runs it: the whole tiny hero DAG on a fresh prefix and compile cache, then its rerun.

Runs `experiments/hero_535b.py --scale tiny --backend ray` (what `make demo` runs) twice under one temporary prefix,
each with a JAX compilation cache of its own run's making (a fresh clone's: empty the first time), and records:

- `run_s`: the first run's wall seconds, every step run (`steps`: how many its summary says ran);
- `cpu_s`: the CPU seconds of every process of that run (the driver, its local Ray's daemons and workers, each step's
  process), read from a cpuacct control group the benchmark puts itself in (tests/support/durations_table.py's
  `CpuMeter`); None where the machine has no writable one. `cores_busy` = `cpu_s / run_s`;
- `rerun_s`, `rerun_steps_skipped`: the second run, which must skip every step, and `rerun_over_run`, its wall time
  as a share of the first's (the limit it is measured against: the run it skips);
- `hero_predicted` (with its band, `hero_low` .. `hero_high`), `hero_achieved`, `hero_error_pct`, `hero_inside`:
  the summary's prediction and landing (the ladder's claim, on this run). They are this machine's: XLA compiles for
  the CPU it runs on, so another vector extension lands elsewhere in the band (docs/hero.md, "On one machine"), and
  the machine record names it (`vector_isa`, `cpu_id`).

The machine's load at the start is among the figures (`load_average_start`), at the end in the machine record: a
busy neighbour moves a wall time. `python benchmarks/render.py` (`make bench-docs`) puts the figures on the
benchmarks page; tests/e2e/test_hero_tiny.py holds `summary_figures` to the real demo's output.

    python benchmarks/bench_demo.py                    # 6 to 10 minutes on 2 idle cores, by CPU
    python benchmarks/bench_demo.py --prefix /tmp/d    # keeps the prefix (a look: build/benchmarks/)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests" / "support")]

from durations_table import CpuMeter  # noqa: E402
from results import record  # noqa: E402
from run_processes import run_demo  # noqa: E402

RUN_TIMEOUT_S = 3600
SUMMARY_STEPS = re.compile(
    r"(\d+) step\(s\) ran here(?: \(\d+ taken over from a holder that was gone\))?"
    r"(?:, (\d+) ran by another executor)?, (\d+) were already done"
)
"""The executor's summary line (executor/run/executor.py `Executor.summary`): ran here, by another executor, skipped."""
SUMMARY_ERROR = re.compile(r"achieved vs predicted: ([+-][\d.]+)%, (inside|outside) the band")
SUMMARY_PREDICTED = re.compile(r"predicted \S+ loss: ([\d.]+) \(band ([\d.]+) \.\. ([\d.]+)\)")
SUMMARY_ACHIEVED = re.compile(r"achieved macro held-out loss: ([\d.]+)")
HERO_FIGURES = ("hero_predicted", "hero_low", "hero_high", "hero_achieved", "hero_error_pct", "hero_inside")


def summary_figures(output: str) -> dict[str, Any]:
    """What the demo's closing summary says: steps run here, by another executor and skipped, and the hero's
    prediction (with its band), achieved loss and error (None where this run did not print them)."""
    steps = SUMMARY_STEPS.findall(output)
    if not steps:
        raise ValueError(f"the demo printed no 'N step(s) ran here' summary; end of its output:\n{output[-3000:]}")
    ran, elsewhere, skipped = (int(count or 0) for count in steps[-1])
    error, predicted, achieved = (pattern.findall(output) for pattern in (SUMMARY_ERROR, SUMMARY_PREDICTED,
                                                                         SUMMARY_ACHIEVED))  # fmt: skip
    return {"ran": ran, "elsewhere": elsewhere, "skipped": skipped,
            "hero_predicted": float(predicted[-1][0]) if predicted else None,
            "hero_low": float(predicted[-1][1]) if predicted else None,
            "hero_high": float(predicted[-1][2]) if predicted else None,
            "hero_achieved": float(achieved[-1]) if achieved else None,
            "hero_error_pct": float(error[-1][0]) if error else None,
            "hero_inside": error[-1][1] == "inside" if error else None}  # fmt: skip


def run_once(prefix: str, cache: str, log: Path) -> tuple[float, str]:
    """One `make demo` run under `prefix`; its wall seconds and output (also appended to `log`)."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    code, seconds, output = run_demo(prefix, log, env=env, timeout_s=RUN_TIMEOUT_S)
    if code != 0:
        raise RuntimeError(f"make demo's DAG failed (exit {code}); end of {log}:\n{output[-3000:]}")
    return seconds, output


def measure(prefix: str, log: Path) -> dict[str, Any]:
    load_start = [round(load, 2) for load in os.getloadavg()]
    cache = tempfile.mkdtemp(prefix="demo-jax-cache-")
    meter = CpuMeter.start(f"bench-demo-{os.getpid()}")
    try:
        before = meter.seconds() if meter else None
        run_s, output = run_once(prefix, cache, log)
        cpu_s = meter.seconds() - before if meter and before is not None else None
        rerun_s, rerun_output = run_once(prefix, cache, log)
    finally:
        if meter:
            meter.stop()  # this process back to its parent group; the group removed
        shutil.rmtree(cache, ignore_errors=True)
    first, again = summary_figures(output), summary_figures(rerun_output)
    if first["skipped"] or first["elsewhere"] or again["ran"] or again["elsewhere"]:
        raise RuntimeError(f"expected a fresh run and a rerun that skips every step, got {first} then {again}; "
                           f"see {log}")  # fmt: skip
    return {
        "steps": first["ran"],
        "run_s": round(run_s, 1),
        "cpu_s": None if cpu_s is None else round(cpu_s, 1),
        "cores_busy": None if cpu_s is None else round(cpu_s / run_s, 2),
        "rerun_s": round(rerun_s, 1),
        "rerun_steps_skipped": again["skipped"],
        "rerun_over_run": round(rerun_s / run_s, 3),
        **{key: first[key] for key in HERO_FIGURES},
        "load_average_start": load_start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefix", default=None, help="run under this prefix and keep it (default: a temporary one)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        prefix = args.prefix or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-demo-"))
        log = Path(prefix).parent / f"{Path(prefix).name}.log"
        print(f"make demo's DAG under {prefix} (output: {log}), then its rerun; 6 to 10 minutes on 2 idle cores",
              file=sys.stderr)  # fmt: skip
        figures = measure(prefix, log)
    print(f"{figures['steps']} steps in {figures['run_s']:.0f} s ({figures['cpu_s']} CPU-s); rerun "
          f"{figures['rerun_s']:.1f} s", file=sys.stderr)  # fmt: skip
    record("bench_demo", figures, parser, args)


if __name__ == "__main__":
    main()
