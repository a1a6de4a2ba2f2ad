"""docs/benchmarks.md's figures are the benchmarks' own: the page is what benchmarks/render.py makes of the committed
results files, every benchmark writes its file through benchmarks/results.py, and the suite's per-file durations
table is summed from pytest's reports (under pytest-xdist too) and rendered the same way."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """A module of benchmarks/ by file, under a name of its own (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = load("render")


def test_the_page_is_what_the_results_files_render() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert render.render_page() == page, "docs/benchmarks.md differs from benchmarks/results/: run `make bench-docs`"


def test_every_benchmark_records_its_figures_under_its_own_name() -> None:
    """Each bench_*.py calls results.record with its own name (a variant: its name plus the flag's), so its figures
    reach benchmarks/results/ and the page; a new benchmark that only prints fails here."""
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        tree = ast.parse(script.read_text(encoding="utf-8"))
        names = {
            node.args[0].value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "record"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        }
        assert script.stem in names, f"{script.name} never calls record({script.stem!r}, figures, ...)"
        assert names <= {script.stem, *(v for v, (s, *_) in render.VARIANTS.items() if s == script.stem)}, names


def test_each_results_file_says_when_and_on_what_machine() -> None:
    results = render.load_results()
    assert results, "no benchmarks/results/bench_*.json: run a benchmark"
    for name, result in results.items():
        assert result["benchmark"] == name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", result["date"]), name
        machine = result["machine"]
        assert machine["cores"] >= 1 and machine["cpu_model"] and len(machine["load_average"]) == 3, name
        assert result["figures"], name
        assert result["command"].startswith("python benchmarks/"), name


def test_a_machine_record_names_the_cpu_generation_and_its_widest_vector_extension() -> None:
    """A trained loss's last bits follow the CPU's vector extension (XLA compiles for the host), and a virtual machine
    shows several generations as "AMD EPYC": a result's machine record says which one (the executor's own record of
    the CPU, tests/executor/dag/test_compare_equivalence.py), and the page's machine line shows it."""
    from executor.dag.records import cpu_words, this_cpu

    results = load("results")
    record = results.machine()
    assert {key: record[key] for key in this_cpu()} == this_cpu()
    words = ", ".join(word for word in (record["cpu_model"], record["cpu_id"], record["vector_isa"]) if word)
    assert render.machine_line({"machine": record}).startswith(f"{os.cpu_count()} cores ({words}), ")
    # a record from before the fields were kept has the model name alone
    assert cpu_words({"cpu_model": "AMD EPYC"}) == "AMD EPYC"
    assert cpu_words({"cpu_model": "AMD EPYC", "cpu_id": "family 25 model 1", "vector_isa": "AVX2"}) == (
        "AMD EPYC, family 25 model 1, AVX2")  # fmt: skip


BURNER = """
import subprocess, sys, time
from pathlib import Path

BURN = (
    "import sys, time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass\\n"
    "open(sys.argv[1], 'w').close()"
)


def test_a_process_nobody_waits_for_counts(tmp_path):
    # Detached and never waited for, as a local Ray's daemons are: getrusage(RUSAGE_CHILDREN) would miss it.
    done = tmp_path / "done"
    subprocess.Popen([sys.executable, "-c", BURN, str(done)], start_new_session=True)
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists()
"""


def test_the_durations_table_gives_each_file_the_cpu_of_every_process_it_started(tmp_path: Path) -> None:
    """A file whose test starts a detached process that burns one CPU-second counts it; a file that sleeps
    counts little; the page shows both columns. Where this machine has no writable cpuacct group, the table
    says it has no CPU seconds instead."""
    (tmp_path / "test_burns.py").write_text(BURNER)
    (tmp_path / "test_sleeps.py").write_text("import time\ndef test_sleeps():\n    time.sleep(1.0)\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    table = tmp_path / "durations"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "support")])}
    from durations_table import own_groups

    def groups_under(parents: list[Path]) -> set[Path]:
        return {group for parent in parents for group in parent.glob("pytest-*")}

    before = groups_under(own_groups())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "durations_table", "-n", "2",
         "--durations-table", str(table), "test_burns.py", "test_sleeps.py"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads(table.with_suffix(".json").read_text())
    markdown = table.with_suffix(".md").read_text()
    assert markdown == render.durations_markdown(written) + "\n"
    if not any(os.access(group, os.W_OK) for group in own_groups()):
        assert written["cpu_s"] is None and "no CPU seconds" in markdown
        return
    files = {row["file"]: row for row in written["files"]}
    assert files["test_burns.py"]["cpu_s"] >= 1.0, files
    assert files["test_sleeps.py"]["cpu_s"] < 0.5, files  # sleeping: a second of wall time, little CPU
    assert written["cpu_s"] == pytest.approx(sum(row["cpu_s"] for row in files.values()), abs=0.11)
    assert "| CPU s | CPU share |" in markdown
    assert groups_under(own_groups()) == before, "the session's workers left their groups behind"


def test_a_changed_figure_changes_the_page_and_a_missing_file_is_named(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    page = ROOT / "docs" / "benchmarks.md"
    before = render.render_page(page, results)
    some = sorted(results.glob("bench_*.json"))[0]
    result = json.loads(some.read_text())
    result["figures"]["a_figure_planted_by_the_test"] = 4321.0
    some.write_text(json.dumps(result))
    after = render.render_page(page, results)
    assert "`a_figure_planted_by_the_test` | 4,321 |" in after and after != before
    some.unlink()
    without = render.render_page(page, results)
    assert f"No results yet: `python benchmarks/{some.stem}.py" in without.replace(" --comm", "")
    assert f"`{some.stem}`" in without.split("No results yet: ", 1)[1]


def test_a_page_without_a_benchmarks_section_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    page.write_text(re.sub(r"<!-- (end )?generated: bench_plan -->\n", "", text))
    with pytest.raises(ValueError, match="bench_plan"):
        render.render_page(page)


def test_the_durations_table_sums_each_files_reports_across_xdist_workers(tmp_path: Path) -> None:
    """A session under two xdist workers writes one table: each file's tests counted once, its setup, call and
    teardown seconds summed (a test that sleeps 0.3 s in its fixture and 0.2 s in its body counts at least 0.5 s)."""
    (tmp_path / "test_first.py").write_text(
        "import time, pytest\n"
        "@pytest.fixture\n"
        "def slow_setup():\n    time.sleep(0.3)\n"
        "def test_sleeps(slow_setup):\n    time.sleep(0.2)\n"
        "@pytest.mark.parametrize('n', range(3))\n"
        "def test_many(n):\n    assert n < 3\n"
    )
    (tmp_path / "test_second.py").write_text("def test_fails():\n    assert False\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    table = tmp_path / "build" / "durations"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "support")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "durations_table", "-n", "2",
         "--durations-table", str(table), "test_first.py", "test_second.py"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # the planted failure
    written = json.loads(table.with_suffix(".json").read_text())
    files = {row["file"]: row for row in written["files"]}
    assert set(files) == {"test_first.py", "test_second.py"}
    assert files["test_first.py"]["tests"] == 4 and files["test_second.py"]["tests"] == 1
    assert files["test_first.py"]["seconds"] >= 0.5
    assert written["tests"] == 5 and written["failed"] == 1 and written["workers"] == 2
    assert written["files"][0]["file"] == "test_first.py"  # longest first
    markdown = table.with_suffix(".md").read_text()
    assert markdown == render.durations_markdown(written) + "\n"
    assert "| `test_first.py` | 4 |" in markdown
