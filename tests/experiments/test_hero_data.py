"""The hero DAG's data chain: one exact and one fuzzy dedup pass over every source but the exempt ones, each source's
documents kept apart (`docs/<source>/`) for the per-source steps; at tiny scale, copies planted across sources are
removed by those passes and survive only where a source is exempt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hero_plan import structure

from executor import Executor
from experiments import hero_535b
from steps.corpora.real_corpus import read_ground_truth
from steps.data.documents import list_input_files, read_shard_table
from steps.dedup.minhash import jaccard

DOMAIN_SOURCE = {"web_docstrings": "web", "code_stdlib": "code", "math_docstrings": "math",
                 "reference_pydoc": "reference", "prose_kjv": "books"}  # fmt: skip


@pytest.mark.parametrize("scale", ["full", "tiny"])
def test_dedup_runs_once_over_every_source_but_the_exempt_ones(scale: str, tmp_path: Path) -> None:
    chosen = hero_535b.SCALES[scale]()
    _names, edges = structure(chosen, tmp_path)
    deduplicated = [source for source in hero_535b.SOURCES if source not in chosen.dedup_exempt]
    assert chosen.dedup_exempt and deduplicated
    into = lambda step: {edge[0] for edge in edges if edge[1] == step}  # noqa: E731
    assert into("data/exact_dedup") == {f"download/{source}" for source in deduplicated}
    assert into("data/fuzzy_dedup") == {f"data/{source}/fasttext_filter" for source in deduplicated}
    for source in hero_535b.SOURCES:
        exempt = source in chosen.dedup_exempt
        assert into(f"data/{source}/heuristics") == {f"download/{source}" if exempt else "data/exact_dedup"}
        suite_text = "download/paloma" if scale == "full" else "eval_suite/text"  # the eval suite's text, too
        assert into(f"data/{source}/decontaminate") == {
            f"data/{source}/fasttext_filter" if exempt else "data/fuzzy_dedup", "download/eval_sets", suite_text}
    assert not any(name.endswith("_dedup") and name.count("/") > 1 for name in _names), "a per-source dedup is left"


def test_tiny_cross_source_copies_are_removed_by_the_global_passes(tmp_path: Path) -> None:
    """Runs the tiny DAG up to the global fuzzy dedup: every cross-source copy whose original and copy are both in
    deduplicated sources is gone after exact dedup (exact copies) or fuzzy dedup (near copies; their original is
    kept); the exempt source has no output folder in either pass."""
    dag = hero_535b.build_dag(hero_535b.tiny_scale())
    executor = Executor(prefix=str(tmp_path / "prefix"))
    executor.run(dag.steps, run_only=["data/fuzzy_dedup"])
    outputs = {step.name: executor.output_paths[step] for step in dag.steps if step in executor.output_paths}
    exempt = hero_535b.tiny_scale().dedup_exempt

    def ids(step: str, source: str) -> set[str]:
        return {doc_id for path in list_input_files(f"{outputs[step]}/docs/{source}")
                for doc_id in read_shard_table(path).column("id").to_pylist()}  # fmt: skip

    def texts(step: str) -> dict[str, str]:
        return {row["id"]: row["text"] for path in list_input_files(f"{outputs[step]}/docs")
                for row in read_shard_table(path).select(["id", "text"]).to_pylist()}  # fmt: skip

    crossed = [record for record in read_ground_truth(outputs["raw/real_corpus"])
               if record["kind"].startswith("cross")]  # fmt: skip
    assert len(crossed) == 4 * 4  # 2 exact + 2 near into each domain after the first
    checked = {"cross_exact": 0, "cross_near": 0}
    for record in crossed:
        copy_source, original_source = (DOMAIN_SOURCE[record[key].split("/")[0]] for key in ("id", "of"))
        if copy_source in exempt or original_source in exempt:
            continue  # not in the dedup passes, so not removed by them
        stage = "data/exact_dedup" if record["kind"] == "cross_exact" else "data/fuzzy_dedup"
        if stage == "data/fuzzy_dedup":
            original, copy = (texts(f"data/{source}/fasttext_filter").get(record[key])
                              for source, key in ((original_source, "of"), (copy_source, "id")))  # fmt: skip
            # Filtered out, or cut by exact paragraph dedup (a near copy's unchanged paragraphs are exact copies).
            if original is None or copy is None or jaccard(original, copy) < 0.8:
                continue
        assert record["of"] in ids(stage, original_source)
        assert record["id"] not in ids(stage, copy_source), record
        checked[record["kind"]] += 1
    assert checked["cross_exact"] >= 2 and checked["cross_near"] >= 1, checked
    stats = json.loads(Path(outputs["data/exact_dedup"], "stats.json").read_text())
    assert set(stats["docs_out_by_source"]) == {s for s in hero_535b.SOURCES if s not in exempt}
    for step in ("data/exact_dedup", "data/fuzzy_dedup"):
        folders = sorted(path.name for path in Path(outputs[step], "docs").iterdir())
        assert folders == sorted(stats["docs_out_by_source"])



def test_dedup_over_sources_keeps_each_source_apart_and_refuses_unnamed_inputs(tmp_path: Path) -> None:
    """A page in two sources is kept once, from the source read first; each source's survivors sit in its own folder."""
    from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup
    from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup

    page = " ".join(f"word{number} filler{number % 7}" for number in range(120))
    web_only, code_only = "only on the web " * 20, "def only_in_code(): pass\n" * 10
    sources = {"web": [{"id": "w1", "text": page}, {"id": "w2", "text": web_only}],
               "code": [{"id": "c1", "text": page}, {"id": "c2", "text": code_only}]}  # fmt: skip
    for name, documents in sources.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "part.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in documents))
    inputs = [str(tmp_path / name) for name in sources]
    for step, config in ((exact_dedup, ExactDedupConfig), (fuzzy_dedup, FuzzyDedupConfig)):
        output = tmp_path / step.__name__
        step(config(input_paths=inputs, input_sources=list(sources), output_path=str(output), parallelism="thread"))
        kept = {name: {row for path in list_input_files(str(output / "docs" / name))
                       for row in read_shard_table(path).column("id").to_pylist()} for name in sources}  # fmt: skip
        assert kept == {"web": {"w1", "w2"}, "code": {"c2"}}, step.__name__
        stats = json.loads((output / "stats.json").read_text())
        assert stats["docs_in_by_source"] == {"web": 2, "code": 2} and stats["docs_out_by_source"]["code"] == 1
        with pytest.raises(ValueError, match=rf"dedup at {tmp_path}/bad: input_sources must name each of the 2"):
            step(config(input_paths=inputs, input_sources=["web"], output_path=str(tmp_path / "bad")))
