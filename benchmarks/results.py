"""Where a benchmark's figures go: one JSON file per benchmark, with the date and the machine they were measured on.

Each `benchmarks/bench_<topic>.py` ends with `record("bench_<topic>", figures, parser, args)`, which prints the
figures as one JSON line (last, as before) and writes them to `benchmarks/results/bench_<topic>.json`:

    {"benchmark": "bench_plan", "date": "2026-12-06", "command": "python benchmarks/bench_plan.py",
     "machine": {"cores": 2, "cpu_model": "AMD EPYC", "cpu_id": "family 25 model 1", "vector_isa": "AVX2",
                 "memory_gib": 23.4, "load_average": [1.2, 1.4, 1.9]},
     "seconds": 212.4, "figures": {...}}

`python benchmarks/render.py` (`make bench-docs`) renders docs/benchmarks.md's tables from these files, and
tests/project/test_benchmarks_page.py fails when the page and the files disagree, so a figure on the page is always
one a benchmark wrote. A run with other settings than the defaults (`--sizes 500`, `--docs 5000`) is a look, not
the page's figure: it goes to build/benchmarks/ instead, so it never replaces the committed one by accident.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from executor.dag.records import this_cpu

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
"""The committed figures: one `<benchmark>.json` per benchmark run with its defaults."""
LOOKS = ROOT / "build" / "benchmarks"
"""Runs with other settings: kept out of the committed results."""

_STARTED = time.monotonic()


def memory_gib() -> float | None:
    """The machine's memory in GiB (Linux's /proc/meminfo), None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: cores, CPU model (with its family and widest vector extension, which
    move a trained loss's last bits), memory and its load average (1, 5 and 15 minutes) as the benchmark ends,
    since a neighbour's load moves a wall time and the page says how busy it was."""
    return {
        **this_cpu(),
        "memory_gib": memory_gib(),
        "load_average": [round(load, 2) for load in os.getloadavg()],
    }


def runs_with_defaults(
    parser: argparse.ArgumentParser | None, args: argparse.Namespace | None, variant: tuple[str, ...] = ()
) -> bool:
    """Whether `args` are the parser's defaults, apart from the flags in `variant` (a variant has its own file)."""
    if parser is None or args is None:
        return True
    defaults = vars(parser.parse_args([]))
    given = vars(args)
    return all(given[key] == defaults.get(key) for key in given if key not in variant)


def record(
    name: str,
    figures: dict[str, Any],
    parser: argparse.ArgumentParser | None = None,
    args: argparse.Namespace | None = None,
    variant: tuple[str, ...] = (),
) -> Path:
    """Print `figures` as one JSON line and write them, dated, with the machine, to `benchmarks/results/<name>.json`
    (or build/benchmarks/ when `args` are not the defaults); the file written."""
    print(json.dumps(figures), flush=True)
    result = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "command": " ".join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "machine": machine(),
        "seconds": round(time.monotonic() - _STARTED, 1),
        "figures": figures,
    }
    folder = RESULTS if runs_with_defaults(parser, args, variant) else LOOKS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"figures written to {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return path
