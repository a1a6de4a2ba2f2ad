"""One process on this machine, named so that pid reuse cannot pass for it.

A pid alone names a process only while it runs: Linux hands out pids in order up to `pid_max` (32,768 by default)
and then wraps, so on a busy machine (a test suite, a local Ray starting workers) a dead process's pid goes to a new
one within minutes. A lease holder's pid that now belongs to another process would keep a dead holder "alive"; a gang
member's would have the teardown SIGKILL whatever process got it. With the process's start time (clock ticks after
boot, the 22nd field of /proc/PID/stat) the pair names one process for the machine's uptime.
"""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the process's name: the 3rd (state) is [0], the 22nd (start time) is [19].
    Raises OSError as reading it does (FileNotFoundError: no such process)."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    return stat.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks after boot; None when there is no such process, or no /proc."""
    try:
        return int(_stat_fields(pid)[19])
    except OSError:
        return None


def is_running(pid: int, started: int | None = None) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, does not) and, where `started` is given, is still
    the process that started then (not a later one that was given the same pid). Without /proc (not Linux): whether
    a signal could be sent to `pid`."""
    try:
        fields = _stat_fields(pid)
    except FileNotFoundError:
        return False
    except OSError:
        return _signal_reaches(pid)
    return fields[0] != "Z" and (started is None or int(fields[19]) == started)


def _signal_reaches(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
