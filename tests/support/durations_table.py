"""Where the suite's time goes: pytest's own timings summed per test file, written as a table when asked.

`make test` passes `--durations-table build/test-durations`, and the session then writes
`build/test-durations.json` (each file's seconds and test count, the session's wall time, its workers, the date and
the machine with its load) and `build/test-durations.md` (the same as a Markdown table, longest first).
`make durations-docs` copies the JSON into benchmarks/results/ and renders it into docs/benchmarks.md
(benchmarks/render.py), where tests/project/test_benchmarks_page.py holds the page to the committed file.

A file's seconds are the sum of its tests' setup, call and teardown durations as pytest measures them, so module
and session fixtures count in the file that first asks for them. Under pytest-xdist every report reaches the
controller's `pytest_runtest_logreport`, which sums them; the workers write nothing. The sum over files is more
than the session's wall time when workers run side by side, and a file's seconds grow with what runs beside it.

A file's CPU seconds say what it costs whatever runs beside it: each worker (or the one process without xdist)
puts itself in a cpuacct control group of its own (`CpuMeter`), which every process it starts joins (a test's
subprocesses, a local Ray's daemons and workers, a gang's members), and hands each report the group's CPU time
since the last one. Under `--dist loadfile` a worker runs one file at a time, so a file's sum is what it and
everything it started used; a process a file leaves running counts in the next one. Where the machine has no
writable cpuacct hierarchy (cgroup v1's `cpuacct`, or v2's `cpu.stat`), the table has no CPU column and says so.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--durations-table",
        default=None,
        metavar="PATH",
        help="write the tests' seconds summed per file to PATH.json and PATH.md (make test: build/test-durations)",
    )


V1_MOUNTS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/cpu,cpuacct"))
V2_MOUNTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def own_groups() -> list[Path]:
    """The folders of this process's groups that account CPU: cgroup v1's cpuacct group first, then its v2 group."""
    v1: list[Path] = []
    v2: list[Path] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            relative = path.lstrip("/")
            if "cpuacct" in controllers.split(","):
                v1 += [mount / relative for mount in V1_MOUNTS if (mount / "cpuacct.usage").exists()]
            elif controllers == "":
                v2 += [mount / relative for mount in V2_MOUNTS if (mount / "cgroup.controllers").exists()]
    return [group for group in v1 + v2 if group.is_dir()]


class CpuMeter:
    """The CPU seconds of this process and of every process started after it joined (module docstring)."""

    def __init__(self, group: Path) -> None:
        self.group = group
        self.last = self.seconds()

    @classmethod
    def start(cls, name: str) -> CpuMeter | None:
        """This process in a new group `name` under its own (so that a meter around this session, such as the
        outer suite's while it tests this plugin, still counts it); None where none is writable here."""
        for parent in own_groups():
            group = parent / name
            try:
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
                return cls(group)
            except OSError:
                with contextlib.suppress(OSError):
                    group.rmdir()
        return None

    def seconds(self) -> float:
        usage = self.group / "cpuacct.usage"
        if usage.exists():
            return int(usage.read_text()) / 1e9
        stat = dict(line.split() for line in (self.group / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def since_last(self) -> float:
        now = self.seconds()
        spent, self.last = now - self.last, now
        return spent

    def pytest_collection_finish(self) -> None:
        self.since_last()  # collecting is no test's

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
        outcome = yield
        outcome.get_result().user_properties.append(("cpu_s", self.since_last()))

    def pytest_unconfigure(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Every process still in the group (this one, any a test left behind) back to the parent; the group gone."""
        parent = self.group.parent / "cgroup.procs"
        with contextlib.suppress(OSError):
            for pid in (self.group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    parent.write_text(f"{pid}\n")
            self.group.rmdir()


def cpu_seconds(report: pytest.TestReport) -> float | None:
    """The CPU seconds `CpuMeter` gave `report` (None: no meter)."""
    return next((float(value) for name, value in report.user_properties if name == "cpu_s"), None)


class DurationsTable:
    """Sums every report's duration by test file; writes the table when the session ends."""

    def __init__(self, path: Path, config: pytest.Config) -> None:
        self.path = path
        self.config = config
        self.started = time.monotonic()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.cpu: collections.Counter[str] = collections.Counter()
        self.metered = True
        self.tests: dict[str, set[str]] = collections.defaultdict(set)
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        file = report.nodeid.split("::")[0]
        self.seconds[file] += report.duration
        cpu = cpu_seconds(report)
        if cpu is None:
            self.metered = False
        else:
            self.cpu[file] += cpu
        self.tests[file].add(report.nodeid)
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        table = self.table(exitstatus)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.with_suffix(".json").write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
        from benchmarks.render import durations_markdown

        self.path.with_suffix(".md").write_text(durations_markdown(table) + "\n", encoding="utf-8")

    def table(self, exitstatus: int) -> dict[str, Any]:
        from benchmarks.results import machine

        files = [
            {"file": file, "tests": len(self.tests[file]), "seconds": round(self.seconds[file], 1)}
            | ({"cpu_s": round(self.cpu[file], 1)} if self.metered else {})
            for file in sorted(self.seconds, key=lambda file: (-self.seconds[file], file))
        ]
        workers = getattr(self.config.option, "numprocesses", None)
        return {
            "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
            "command": " ".join(["pytest", *sys.argv[1:]]),
            "workers": workers or 0,
            "wall_s": round(time.monotonic() - self.started, 1),
            "tests": sum(row["tests"] for row in files),
            "failed": len(self.failed),
            "exit_status": int(exitstatus),
            "cpu_s": round(sum(self.cpu.values()), 1) if self.metered else None,
            "machine": machine(),
            "files": files,
        }


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("durations_table")
    if not path:
        return
    worker = hasattr(config, "workerinput")
    if not worker:  # only the controller (or a session without xdist) writes
        config.pluginmanager.register(DurationsTable(Path(path), config), "durations-table")
    if worker or not getattr(config.option, "numprocesses", None):  # whoever runs the tests meters them
        meter = CpuMeter.start(f"pytest-{os.getpid()}")
        if meter is not None:
            config.pluginmanager.register(meter, "durations-cpu-meter")
