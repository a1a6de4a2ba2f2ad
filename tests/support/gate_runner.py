"""Run a one-step DAG whose step waits for a gate file: `python tests/support/gate_runner.py PREFIX GATE [BACKEND]`;
with BACKEND `fifo` (local backend) or `ray-fifo`, a step blocked in a native call until GATE, a named pipe, is written.

The interrupt test sends this process SIGINT (Ctrl-C) while the step runs. A shell starts background
jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt handler; this runner restores
it, so the test exercises the executor's Ctrl-C handling however the test suite itself was started.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys

from node_steps import FifoConfig, GateConfig, read_a_fifo, wait_for_gate

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep


def gate_step(gate: str, records: str) -> ExecutorStep:
    return ExecutorStep("gated", wait_for_gate, GateConfig(THIS_OUTPUT_PATH, gate, records))


def fifo_step(fifo: str) -> ExecutorStep:
    return ExecutorStep("blocked", read_a_fifo, FifoConfig(THIS_OUTPUT_PATH, fifo))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test dumps every thread's stack if we hang
    logging.basicConfig(level=logging.INFO)
    prefix, gate = sys.argv[1], sys.argv[2]
    backend = sys.argv[3] if len(sys.argv) > 3 else "local"
    if backend in ("fifo", "ray-fifo"):  # GATE is a named pipe the step blocks on, in the kernel
        Executor(prefix, backend="ray" if backend == "ray-fifo" else "local").run([fifo_step(gate)])
    else:
        Executor(prefix, backend=backend).run([gate_step(gate, prefix + "-records")])
