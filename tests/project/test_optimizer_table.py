"""docs/hero.md's optimizer comparison is what benchmarks/bench_optimizers.py renders from its committed figures.

The table is produced, not typed: the script trains both ladders and writes benchmarks/results/optimizers.json,
then renders it into the docs between two markers. This test trains nothing; it renders the committed JSON
(as `--render` does) and compares, so a hand edit of the table, or of the JSON without a render, fails here.
"""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType

import pytest
from paths import REPO

SCRIPT = REPO / "benchmarks" / "bench_optimizers.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_optimizers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_table_is_the_rendered_results() -> None:
    script = load_script()
    results = json.loads(script.RESULTS.read_text())
    text = script.DOC.read_text()
    assert text.count(script.BEGIN) == 1 and text.count(script.END) >= 1, f"{script.DOC} lost its markers"
    assert script.render_docs(results, text) == text, (
        f"{script.DOC}'s optimizer table differs from {script.RESULTS}: "
        "run `python benchmarks/bench_optimizers.py --render` (or the script itself, to measure again)"
    )


def test_the_results_hold_both_optimizers_with_every_figure() -> None:
    results = json.loads(load_script().RESULTS.read_text())
    assert {"date", "git_commit", "machine", "optimizers"} <= set(results)
    assert {"cores", "cpu_model", "load_average_start", "load_average_end"} <= set(results["machine"])
    assert set(results["optimizers"]) == {"adamw", "hero"}
    for figures in results["optimizers"].values():
        assert [rung["name"] for rung in figures["rungs"]] == ["d768", "d1024", "d1536", "d2048"]
        assert set(figures["fit"]) == {"E", "A", "alpha", "rms_log_residual"}
        hero = figures["hero"]
        assert hero["inside"] == (hero["low"] <= hero["achieved"] <= hero["high"])
        assert hero["relative_error"] == pytest.approx((hero["achieved"] - hero["predicted"]) / hero["predicted"])


def test_a_doc_without_the_markers_is_refused() -> None:
    script = load_script()
    results = json.loads(script.RESULTS.read_text())
    with pytest.raises(ValueError, match="block"):
        script.render_docs(results, "# no table here\n")
