"""What a `python -m executor publish --watch` cycle costs, on a real DAG of 40 steps with 8 runs.

    python benchmarks/bench_publish.py                  # figures, then one JSON line of them last
    python benchmarks/bench_publish.py --lines 20000    # longer runs

The prefix is made by the real executor: `data/corpus`, 31 data steps and 8 train-like runs of 16 figures a
metrics line (about 560 bytes, like a Levanter MoE run's): seven have logged `--lines` lines, one has just
begun (one line). Then, in this one run, side by side:

- bytes written per new metrics line against the line's own bytes, for cycles that find 1, 10 and 100 new
  lines on one run (goal: about 1x plus a fixed cost per cycle), the same on a run grown 10x (goal: equal),
  and over many small cycles on the run that has just begun, folds of chunks into segments included (goal:
  about 2x plus the fixed cost);
- an idle cycle: files opened and folders listed per step in the prefix (goal: no file opened, one listing a
  step), counted with Python's audit hooks on the real disk, and its time against a first (full) cycle's.

Bytes are the publisher's own count of what it put in the destination
(tests/executor/watch/site/test_publish_cost.py checks the same figures against the destination folder itself).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import record

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, versioned
from executor.store.layout import METRICS_FILE
from executor.watch.site.publish import SitePublisher

RUNS = 8
DATA_STEPS = 31


@dataclass(frozen=True)
class DataConfig:
    output_path: str
    number: int = versioned(0)


def data_step(config: DataConfig) -> None:
    Path(config.output_path, "stats.json").write_text(json.dumps({"docs_out": 1000 + config.number}))


@dataclass(frozen=True)
class RunConfig:
    output_path: str
    corpus_path: str
    lines: int = versioned(2000)
    seed: int = versioned(0)


def metrics_line(step: int, seed: int = 0) -> str:
    """A healthy run's line at `step`, with the keys a Levanter MoE run logs (about 600 bytes)."""
    wobble = 0.01 * math.sin(1.7 * step + seed)
    figures: dict[str, Any] = {
        "step": step,
        "time": 1_700_000_000.0 + 2.0 * step,
        "train/loss": 8.0 * (step + 10) ** -0.3 + wobble,
        "optim/learning_rate": 3e-4 * min(1.0, (step + 1) / 100),
        "grad/norm/total": 1.0 + 0.05 * math.cos(step),
        "params/norm/total": 180.0 + 0.01 * step,
        "router/bias/norm": 0.5 + 1e-4 * step,
        "router/load/max_over_min": 2.0 + 0.1 * math.sin(step),
        "router/load/max_over_mean": 1.5 + 0.05 * math.cos(step),
        "router/dropped_fraction": 0.05,
        "throughput/tokens_per_second": 1000.0 + 20.0 * math.sin(step),
        "throughput/examples_per_second": 8.0 + 0.1 * math.sin(step),
        "mfu": 0.41 + 0.001 * math.sin(step),
        "train/tokens": 4096 * 8 * (step + 1),
        "train/flops": 2.5e12 * (step + 1),
        "optim/update_norm": 0.002 + 1e-5 * math.cos(step),
    }
    return json.dumps(figures)


def run_step(config: RunConfig) -> None:
    lines = "".join(metrics_line(step, config.seed) + "\n" for step in range(config.lines))
    Path(config.output_path, METRICS_FILE).write_text(lines)


def build_prefix(prefix: Path, lines: int) -> list[Path]:
    """Run the DAG; returns the runs' metrics files."""
    corpus = ExecutorStep(name="data/corpus", fn=data_step, config=DataConfig(output_path=THIS_OUTPUT_PATH))
    data = [
        ExecutorStep(name=f"data/shard-{n:02d}", fn=data_step, config=DataConfig(THIS_OUTPUT_PATH, versioned(n)))
        for n in range(DATA_STEPS)
    ]
    runs = [
        ExecutorStep(
            name=f"train/run-{n}",
            fn=run_step,
            config=RunConfig(THIS_OUTPUT_PATH, output_path_of(corpus), versioned(lines if n else 1), versioned(n)),
        )
        for n in range(RUNS)
    ]
    executor = Executor(str(prefix))
    executor.run([corpus, *data, *runs], caller="benchmarks/bench_publish.py", description="publish benchmark")
    return [Path(executor.output_paths[run]) / METRICS_FILE for run in runs]


def append(metrics: Path, first: int, count: int) -> int:
    text = "".join(metrics_line(step) + "\n" for step in range(first, first + count))
    with metrics.open("a") as handle:
        handle.write(text)
    return len(text.encode())


@contextmanager
def counted_reads(prefix: Path) -> Iterator[dict[str, list[str]]]:
    """Files opened and folders listed under `prefix` while the block runs (Python's audit events)."""
    seen: dict[str, list[str]] = {"opened": [], "listed": []}
    root = str(prefix)
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not active[0] or not args or not isinstance(args[0], str) or not args[0].startswith(root):
            return
        if event == "open":
            seen["opened"].append(args[0])
        elif event in ("os.scandir", "os.listdir"):
            seen["listed"].append(args[0])

    sys.addaudithook(hook)  # hooks cannot be removed: this one goes quiet when the block ends
    try:
        yield seen
    finally:
        active[0] = False


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    prefix, site = folder / "prefix", folder / "site"
    runs = build_prefix(prefix, args.lines)
    steps = 1 + DATA_STEPS + RUNS
    publisher = SitePublisher(str(prefix), str(site))
    start = time.perf_counter()
    first = publisher.cycle()
    first_s = time.perf_counter() - start
    with counted_reads(prefix) as reads:
        start = time.perf_counter()
        idle = publisher.cycle()
        idle_s = time.perf_counter() - start
    figures: dict[str, Any] = {"steps": steps, "runs": RUNS, "lines_per_run": args.lines}
    figures |= {"first_cycle_files": first.files_written, "first_cycle_bytes": first.bytes_written}
    figures |= {"idle_bytes": idle.bytes_written, "idle_files_opened": len(reads["opened"])}
    figures |= {"idle_listings_per_step": round(len(reads["listed"]) / steps, 3)}
    figures |= {"first_cycle_s": round(first_s, 3), "idle_cycle_s": round(idle_s, 4)}
    figures["idle_vs_first_cycle_time"] = round(idle_s / first_s, 4)
    step = args.lines
    for count in (1, 10, 100):
        line_bytes = append(runs[1], step, count)
        step += count
        written = publisher.cycle().bytes_written
        figures[f"bytes_per_line_ratio_k{count}"] = round(written / line_bytes, 3)
        figures[f"fixed_bytes_k{count}"] = written - line_bytes
    grow = 9 * args.lines  # the run grows 10x
    append(runs[1], step, grow)
    step += grow
    publisher.cycle()
    line_bytes = append(runs[1], step, 10)
    grown = publisher.cycle().bytes_written
    figures["grown_10x_bytes_per_line_ratio_k10"] = round(grown / line_bytes, 3)
    figures["grown_10x_vs_short_k10"] = round(grown / line_bytes / figures["bytes_per_line_ratio_k10"], 3)
    total = new = 0
    for cycle in range(args.cycles):
        new += append(runs[0], 1 + 10 * cycle, 10)
        total += publisher.cycle().bytes_written
    figures["many_cycles"] = args.cycles
    figures["many_cycles_bytes_per_line_ratio"] = round(total / new, 3)
    index = json.loads((site / "data/step" / runs[0].parent.relative_to(prefix) / "metrics/index.json").read_text())
    figures["many_cycles_segments_sealed"] = index["segments"]
    figures["page_files_for_run"] = index["segments"] + index["next_chunk"] - index["first_chunk"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2000, help="metrics lines each run starts with")
    parser.add_argument("--cycles", type=int, default=150, help="small cycles (10 lines each) for the amortised cost")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as folder:
        figures = measure(args, Path(folder))
    print(f"first cycle: {figures['first_cycle_files']} files, {figures['first_cycle_bytes']:,} bytes")
    opened, listings = figures["idle_files_opened"], figures["idle_listings_per_step"]
    print(
        f"idle cycle: {figures['idle_bytes']} bytes written, {opened} files opened, {listings} listings a step, "
        f"{figures['idle_vs_first_cycle_time']}x the first cycle's time"
    )
    for count in (1, 10, 100):
        ratio, fixed = figures[f"bytes_per_line_ratio_k{count}"], figures[f"fixed_bytes_k{count}"]
        print(f"{count:>3} new lines: {ratio}x their bytes ({fixed:,} bytes besides them)")
    print(f"a run 10x as long, 10 new lines: {figures['grown_10x_vs_short_k10']}x the short run's cost")
    ratio, sealed = figures["many_cycles_bytes_per_line_ratio"], figures["many_cycles_segments_sealed"]
    print(f"{args.cycles} cycles of 10 lines: {ratio}x the lines' bytes in all ({sealed} segments sealed)")
    record("bench_publish", figures, parser, args)


if __name__ == "__main__":
    main()
