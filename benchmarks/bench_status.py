"""Status reads at scale, on a GCS emulator started by this script (127.0.0.1 only).

1. Status of N finished steps (default 1,000): the executor's batched concurrent read
   (`status.read_many_events`, what dry runs, `status` and the skip pass use) against reading
   them one by one, measured side by side in one run. Goal: >= 10x. The emulator answers in
   ~1.5 ms with no network in between, and serves one connection at a time (a listen backlog of
   5), so concurrency cannot show against it bare: the reads go through a proxy that adds 20 ms
   per request, the order of a real GCS round trip, and forwards one request at a time.
2. Resume cost: rerun a finished 100-step DAG on the emulator and on local disk (everything is
   SUCCESS, so it only plans, reads statuses and skips). Goal: seconds.

    python benchmarks/bench_status.py [--steps 1000] [--dag-steps 100]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from results import record
from services import FaultProxy, running_gcs_emulator, use_gcs_endpoint

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, read_status, storage
from executor.store.events import StatusEvent, StepStatus, read_many_events, status_path


def seed_finished_steps(prefix: str, count: int) -> list[str]:
    """Write `count` finished status histories (WAITING, RUNNING, SUCCESS) under `prefix`."""
    outputs = [storage.join(prefix, f"step{index:05d}-{uuid.uuid4().hex[:8]}") for index in range(count)]
    history = "".join(
        StatusEvent(status, attempt=1, worker="bench").to_json() + "\n"
        for status in (StepStatus.WAITING, StepStatus.RUNNING, StepStatus.SUCCESS)
    )
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(lambda path: storage.write_atomic(status_path(path), history), outputs))
    return outputs


def compare_reads(outputs: list[str], repeats: int, label: str, key: str) -> dict[str, float]:
    parallel = best_of(repeats, lambda: read_many_events(outputs))
    one_by_one = best_of(1, lambda: [read_status(path) for path in outputs])
    assert all(events[-1].status == "SUCCESS" for events in read_many_events(outputs))
    print(f"status of {len(outputs)} finished steps, {label}: batched {parallel:.2f}s, "
          f"one by one {one_by_one:.2f}s -> {one_by_one / parallel:.1f}x (goal >= 10x)")  # fmt: skip
    return {
        f"status_{key}_batched_s": round(parallel, 3),
        f"status_{key}_one_by_one_s": round(one_by_one, 3),
        f"status_{key}_speedup": round(one_by_one / parallel, 1),
    }


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass(frozen=True)
class NoOpConfig:
    output_path: str
    index: int
    inputs: tuple = ()


def write_marker(config: NoOpConfig) -> None:
    storage.write_atomic(storage.join(config.output_path, "out.txt"), str(config.index))


def hundred_step_dag(size: int) -> list[ExecutorStep]:
    """A data-pipeline-like DAG: 10 chains of (size / 10) steps, each chain step reading the previous."""
    steps: list[ExecutorStep] = []
    for chain in range(10):
        previous = None
        for depth in range(size // 10):
            inputs = (output_path_of(previous, "out.txt"),) if previous is not None else ()
            previous = ExecutorStep(f"chain{chain}/s{depth}", write_marker, NoOpConfig(THIS_OUTPUT_PATH, 1, inputs))
            steps.append(previous)
    return steps


def resume_seconds(prefix: str, steps: list[ExecutorStep]) -> tuple[float, float]:
    """(first run, rerun of the finished DAG) in seconds."""
    start = time.perf_counter()
    Executor(prefix).run(steps)
    first = time.perf_counter() - start
    start = time.perf_counter()
    executor = Executor(prefix)
    executor.run(steps)
    rerun = time.perf_counter() - start
    assert all(decision.action == "skip" for decision in executor.decisions)
    return first, rerun


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--dag-steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with running_gcs_emulator() as bucket:
        prefix = f"{bucket}/bench-{uuid.uuid4().hex[:8]}"
        outputs = seed_finished_steps(prefix, args.steps)
        emulator = os.environ["EXECUTOR_TEST_GCS_URL"]
        with FaultProxy(int(emulator.rsplit(":", 1)[1]), fail_rate=0.0, latency_s=args.latency_ms / 1000) as proxy:
            use_gcs_endpoint(f"http://127.0.0.1:{proxy.port}")
            figures |= compare_reads(outputs, args.repeats, f"emulator + {args.latency_ms} ms", "latency")
        use_gcs_endpoint(emulator)
        first, rerun = resume_seconds(f"{bucket}/dag-{uuid.uuid4().hex[:8]}", hundred_step_dag(args.dag_steps))
        figures |= {"gcs_dag_first_run_s": round(first, 2), "gcs_dag_rerun_s": round(rerun, 2)}
        print(
            f"{args.dag_steps}-step DAG on the GCS emulator: first run {first:.1f}s, rerun when finished {rerun:.2f}s"
        )
    with tempfile.TemporaryDirectory() as local:
        first, rerun = resume_seconds(local, hundred_step_dag(args.dag_steps))
        figures |= {"local_dag_first_run_s": round(first, 2), "local_dag_rerun_s": round(rerun, 2)}
        print(f"{args.dag_steps}-step DAG on local disk: first run {first:.1f}s, rerun when finished {rerun:.2f}s")
    record("bench_status", figures, parser, args)


if __name__ == "__main__":
    main()
