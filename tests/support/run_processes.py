"""The processes of one run of an experiment script, found by the temp folder it was given (TMPDIR): its driver, its
local Ray's daemons and workers, and nothing else (Ray's workers rename themselves `ray::...`, and its daemons leave the
driver's process group, so neither a name nor a process group finds them all). Used by the tiny hero's test run
(hero_run.py) and by benchmarks/bench_optimizers.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


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
