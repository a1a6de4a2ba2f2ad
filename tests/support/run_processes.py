"""The processes of one run of an experiment script, found by the temp folder it was given (TMPDIR): its driver, its
local Ray's daemons and workers, and nothing else (Ray's workers rename themselves `ray::...`, and its daemons leave the
driver's process group, so neither a name nor a process group finds them all); and `make demo`'s DAG started or run
that way, by the tiny hero's test run (hero_run.py), benchmarks/bench_demo.py and benchmarks/bench_optimizers.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from paths import REPO

DEMO = ("experiments/hero_535b.py", "--scale", "tiny", "--backend", "ray")
"""`make demo`'s command, less its interpreter and prefix."""


def processes_of(temp: str) -> list[int]:
    """Processes whose environment holds TMPDIR=`temp`."""
    tag = f"TMPDIR={temp}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if tag in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue  # gone, or not ours to read
    return found


def kill_all(temp: str, timeout_s: float = 60) -> list[int]:
    """SIGKILL every process of the run, as a power cut would, until none is left or `timeout_s` passed; the pids
    still alive (none, normally)."""
    deadline = time.monotonic() + timeout_s
    while (pids := processes_of(temp)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    return processes_of(temp)


def end_run(temp: str) -> None:
    """SIGKILL every process of the run, as a power cut would (`kill_all`), and remove its temp folder; a process that
    survives is an AssertionError."""
    survivors = kill_all(temp)
    shutil.rmtree(temp, ignore_errors=True)
    assert not survivors, f"processes of the run in {temp} survived SIGKILL: {survivors}"


def start_demo(prefix: str | Path, out: IO[bytes], *args: str, env: Mapping[str, str]) -> tuple[subprocess.Popen, str]:
    """Start `make demo`'s DAG under `prefix` (`args` appended to its command line), printing to `out`, in a session and
    a temp folder of its own (TMPDIR, which also holds its local Ray's sessions): the process, and that folder, by which
    `kill_all` finds every process of the run. `env` is the run's environment, less TMPDIR."""
    temp = tempfile.mkdtemp(prefix="demo-", dir="/tmp")  # short: Ray's socket paths live under it
    command = [sys.executable, *DEMO, "--prefix", str(prefix), *args]
    environment = {**env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TMPDIR": temp}
    process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                               env=environment)  # fmt: skip
    return process, temp


def run_demo(
    prefix: str | Path, log: Path, *args: str, env: Mapping[str, str], timeout_s: float
) -> tuple[int, float, str]:
    """`make demo`'s DAG run to its end (`start_demo`): its exit code, wall seconds and what it printed, which is also
    appended to `log`. Every process of the run is gone after, its local Ray's daemons too (they outlive the driver's
    process group), and its temp folder removed (`end_run`)."""
    start = log.stat().st_size if log.exists() else 0
    started = time.perf_counter()
    with open(log, "ab") as out:
        process, temp = start_demo(prefix, out, *args, env=env)
        try:
            code = process.wait(timeout=timeout_s)
        finally:
            end_run(temp)
    return code, time.perf_counter() - started, log.read_text(errors="replace")[start:]
