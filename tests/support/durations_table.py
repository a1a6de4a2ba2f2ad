"""Where the suite's time goes: pytest's own timings summed per test file, written as a table when asked.

`make test` passes `--durations-table build/test-durations`, and the session then writes
`build/test-durations.json` (each file's seconds and test count, the session's wall time, its workers, the date and
the machine with its load) and `build/test-durations.md` (the same as a Markdown table, longest first).
`make durations-docs` copies the JSON into benchmarks/results/ and renders it into docs/benchmarks.md
(benchmarks/render.py), where tests/project/test_benchmarks_page.py holds the page to the committed file.

A file's seconds are the sum of its tests' setup, call and teardown durations as pytest measures them, so module
and session fixtures count in the file that first asks for them. Under pytest-xdist every report reaches the
controller's `pytest_runtest_logreport`, which sums them; the workers write nothing. The sum over files is CPU-ish
time spent in tests, more than the session's wall time when workers run side by side.
"""

from __future__ import annotations

import collections
import datetime
import json
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


class DurationsTable:
    """Sums every report's duration by test file; writes the table when the session ends."""

    def __init__(self, path: Path, config: pytest.Config) -> None:
        self.path = path
        self.config = config
        self.started = time.monotonic()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.tests: dict[str, set[str]] = collections.defaultdict(set)
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        file = report.nodeid.split("::")[0]
        self.seconds[file] += report.duration
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
            "machine": machine(),
            "files": files,
        }


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("durations_table")
    if path and not hasattr(config, "workerinput"):  # only the controller (or a session without xdist) writes
        config.pluginmanager.register(DurationsTable(Path(path), config), "durations-table")
