"""Renders docs/benchmarks.md's figures from the files the benchmarks and the suite wrote, so none is typed by hand.

    python benchmarks/render.py                                   # make bench-docs: rewrite the page's tables
    python benchmarks/render.py --durations build/test-durations.json   # make durations-docs: the suite's table too
    python benchmarks/render.py --check                           # exit 1 if the page is not what the files give

The page holds generated sections between markers, `<!-- generated: NAME -->` ... `<!-- end generated: NAME -->`:
`summary` (one row per benchmark: what it measures, from the first line of its docstring, its headline figures, the
date and the machine), one per benchmark (`bench_plan`, ...: every figure of its latest results file,
benchmarks/results/<name>.json, written by `results.record`), and `test-durations` (the suite's seconds per test
file, benchmarks/results/test-durations.json, copied from what `make test` wrote to build/). Everything outside
the markers is prose and stays as written. A benchmark with no results file yet is listed as such, never left out;
tests/project/test_benchmarks_page.py fails when the page and the files disagree.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from executor.dag.records import cpu_words

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"
DURATIONS = RESULTS / "test-durations.json"
SECTION = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)

HEADLINES: dict[str, tuple[str, ...]] = {
    "bench_plan": ("ratio_10k_over_1k", "ratio_leaves_10k_over_1k", "plan_us_per_step_10k"),
    "bench_status": ("status_latency_speedup", "gcs_dag_rerun_s", "local_dag_rerun_s"),
    "bench_dashboard": ("page_cold_s", "page_warm_p50_s", "steps_api_p95_ms"),
    "bench_minhash": ("ours_mb_per_s", "ratio_vs_rensa", "ratio_vs_datatrove"),
    "bench_fasttext": ("ratio",),
    "bench_fuzzy_dedup": ("ratio", "recall_at_0_75", "precision_at_0_5"),
    "bench_dedup_scale": ("rss_above_baseline_growth_10x_docs",),
    "bench_tokenize": ("ratio_vs_raw", "ratio_vs_levanter", "ratio_vs_datatrove"),
    "bench_train": ("ratio_vs_peak",),
    "bench_train_comm": ("comm_bytes_ratio",),
    "bench_plan_memory": ("worst_ratio", "min_ratio", "max_ratio"),
    "bench_publish": ("bytes_per_line_ratio_k1", "bytes_per_line_ratio_k100", "idle_bytes"),
    "bench_optimizers": ("hero.hero_relative_error", "hero.hero_inside", "adamw.hero_relative_error"),
    "bench_demo": ("run_s", "cpu_s", "rerun_over_run"),
}
"""The figures a benchmark's summary row shows (those its results file holds); its own section shows them all."""

WIDEST = 12
"""The most columns a table of records gets; records with more figures are turned a column each."""

VARIANTS = {
    "bench_train_comm": (
        "bench_train",
        "--comm",
        "The expert-parallel train step's collective bytes against the least its layout moves.",
    )
}
"""Results files of a benchmark run with a flag that makes a leg of its own: the script, the flag, what it measures."""


def benchmark_names(page: str = "") -> list[str]:
    """Every benchmark the page must account for (each benchmarks/bench_*.py, and its variants), in the order of
    their sections in `page`, those it lacks last."""
    names = sorted(path.stem for path in (ROOT / "benchmarks").glob("bench_*.py"))
    for variant, (script, *_) in VARIANTS.items():
        names.insert(names.index(script) + 1, variant)
    placed = [match["name"] for match in SECTION.finditer(page) if match["name"] in names]
    return placed + [name for name in names if name not in placed]


def what_it_measures(name: str) -> str:
    """The first paragraph of the benchmark's docstring; for a variant, its flag and what that leg measures."""
    if name in VARIANTS:
        _script, flag, measures = VARIANTS[name]
        return f"`{flag}`: {measures}"
    source = (ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
    return " ".join((ast.get_docstring(ast.parse(source)) or "").strip().split("\n\n")[0].split())


def load_results(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """The results files in `folder` by benchmark name."""
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("bench_*.json"))}


def number(value: Any) -> str:
    """A figure as the page prints it: thousands separated, floats to four significant digits, text as code."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if value == "":
        return ""  # a record without this figure
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(number(item) for item in value)
    return f"`{value}`"


def flatten(figures: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every scalar figure; lists of records are left to `record_lists`."""
    for key, value in figures.items():
        if isinstance(value, dict):
            yield from flatten(value, f"{prefix}{key}.")
        elif not (isinstance(value, list) and value and all(isinstance(item, dict) for item in value)):
            yield f"{prefix}{key}", value


def record_lists(figures: dict[str, Any]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The figures that are lists of records (a probe or a scale per row), by key."""
    for key, value in figures.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            yield key, value


def machine_line(result: dict[str, Any]) -> str:
    machine = result["machine"]
    load = " / ".join(number(float(load)) for load in machine["load_average"])
    memory = f", {number(machine['memory_gib'])} GiB" if machine.get("memory_gib") else ""
    return f"{machine['cores']} cores ({cpu_words(machine)}){memory}, load {load} (1, 5, 15 min)"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def records_table(records: list[dict[str, Any]]) -> list[str]:
    """A list of records (a probe or a scale each) as a table: a row per record, or, when the records hold more
    figures than a row can show, a column per record headed by its first figure and a row per figure."""
    flat = [dict(flatten(record)) for record in records]
    columns = list(dict.fromkeys(column for record in flat for column in record))
    if len(columns) <= WIDEST:
        return table([f"`{column}`" for column in columns], [[number(r.get(c, "")) for c in columns] for r in flat])
    first, rest = columns[0], columns[1:]
    header = ["figure", *(f"`{first}` {number(record.get(first, ''))}" for record in flat)]
    return table(header, [[f"`{column}`", *(number(record.get(column, "")) for record in flat)] for column in rest])


def benchmark_section(name: str, result: dict[str, Any] | None) -> str:
    """A benchmark's own section: when, where and how it ran, then every figure it wrote."""
    if result is None:
        script, flag, _measures = VARIANTS.get(name, (name, "", ""))
        command = f"python benchmarks/{script}.py {flag}".strip()
        return f"No results yet: `{command}` writes benchmarks/results/{name}.json, then `make bench-docs`.\n"
    lines = [
        f"Measured {result['date']} by `{result['command']}` ({number(float(result['seconds']))} s) on "
        f"{machine_line(result)}.",
        "",
        *table(["figure", "value"], [[f"`{key}`", number(value)] for key, value in flatten(result["figures"])]),
    ]
    for key, records in record_lists(result["figures"]):
        lines += ["", f"`{key}`:", "", *records_table(records)]
    return "\n".join(lines) + "\n"


def summary_section(names: list[str], results: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name in names:
        result = results.get(name)
        link = f"[`{name}`](#{name})" if name not in VARIANTS else f"[`{name}`](#{VARIANTS[name][0]})"
        if result is None:
            rows.append([link, what_it_measures(name), "no results yet", "", ""])
            continue
        figures = dict(flatten(result["figures"]))
        headline = "; ".join(f"`{key}` {number(figures[key])}" for key in HEADLINES.get(name, ()) if key in figures)
        machine = result["machine"]
        load = " / ".join(number(float(load)) for load in machine["load_average"])
        where = f"{machine['cores']} cores, load {load}"
        rows.append([link, what_it_measures(name), headline, result["date"], where])
    missing = [name for name in names if name not in results]
    lines = table(["benchmark", "measures", "headline figures", "date", "machine"], rows)
    if missing:
        lines += ["", "No results yet: " + ", ".join(f"`{name}`" for name in missing) + "."]
    return "\n".join(lines) + "\n"


def durations_markdown(durations: dict[str, Any]) -> str:
    """The suite's seconds per test file, longest first (also what the suite writes to build/test-durations.md),
    with each file's CPU seconds where the suite metered them (tests/support/durations_table.py)."""
    total = sum(row["seconds"] for row in durations["files"]) or 1.0
    minutes, seconds = divmod(round(durations["wall_s"]), 60)
    cpu = durations.get("cpu_s")
    head = (
        f"`{durations['command']}` on {durations['date']}: {durations['tests']:,} tests ({durations['failed']} failed) "
        f"in {minutes} min {seconds} s of wall time, {durations['workers'] or 'no'} xdist workers, on "
        f"{machine_line(durations)}. A file's seconds are its tests' setup, call and teardown summed "
        f"({number(total)} s in all), so workers side by side add up to more than the wall time"
    )
    if "cpu_s" not in durations:  # a table from before the suite metered CPU
        head += "."
    elif cpu is None:
        head += "; no CPU seconds (this machine gave the suite no cpuacct group)."
    else:
        head += (
            f"; its CPU seconds are what it and every process it started used, whatever ran beside it "
            f"({number(cpu)} CPU-s in all: {cpu / max(durations['wall_s'], 1.0):.2f} cores busy on average)."
        )
    header = ["test file", "tests", "seconds", "share", *(["CPU s", "CPU share"] if cpu is not None else [])]
    rows = [
        [f"`{row['file']}`", f"{row['tests']:,}", number(float(row["seconds"])), f"{100 * row['seconds'] / total:.1f}%"]
        + ([number(float(row["cpu_s"])), f"{100 * row['cpu_s'] / (cpu or 1.0):.1f}%"] if cpu is not None else [])
        for row in durations["files"]
    ]
    return "\n".join([head, "", *table(header, rows)])


def sections(results: dict[str, dict[str, Any]], durations: dict[str, Any] | None, page: str = "") -> dict[str, str]:
    """Every generated section's body by name (the summary's rows in the order of `page`'s sections)."""
    names = benchmark_names(page)
    bodies = {"summary": summary_section(names, results)}
    bodies |= {name: benchmark_section(name, results.get(name)) for name in names}
    if durations is None:
        bodies["test-durations"] = "No table yet: `make test`, then `make durations-docs`.\n"
    else:
        bodies["test-durations"] = durations_markdown(durations) + "\n"
    return bodies


def render(page: str, bodies: dict[str, str]) -> str:
    """`page` with each generated section's body replaced; a section the page lacks is an error, naming it."""
    missing = set(bodies) - {match["name"] for match in SECTION.finditer(page)}
    if missing:
        raise ValueError(
            f"docs/benchmarks.md has no generated section for {sorted(missing)}: add "
            f"'<!-- generated: NAME -->' and '<!-- end generated: NAME -->' lines where each table goes"
        )

    def replace(match: re.Match[str]) -> str:
        return match[1] + bodies.get(match["name"], match["body"]) + match[4]

    return SECTION.sub(replace, page)


def render_page(page_path: Path = PAGE, results_folder: Path = RESULTS) -> str:
    durations_path = results_folder / DURATIONS.name
    durations = json.loads(durations_path.read_text(encoding="utf-8")) if durations_path.exists() else None
    page = page_path.read_text(encoding="utf-8")
    return render(page, sections(load_results(results_folder), durations, page))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durations", type=Path, help="the table `make test` wrote (build/test-durations.json)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from what the files give")
    args = parser.parse_args()
    if args.durations:
        shutil.copyfile(args.durations, DURATIONS)
        print(f"copied {args.durations} to {DURATIONS.relative_to(ROOT)}")
    rendered = render_page()
    if args.check:
        if rendered != PAGE.read_text(encoding="utf-8"):
            sys.exit("docs/benchmarks.md differs from benchmarks/results/: run `make bench-docs`")
        return
    PAGE.write_text(rendered, encoding="utf-8")
    print(f"rendered {PAGE.relative_to(ROOT)} from {RESULTS.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
