"""The data steps as a DAG: the data demo end to end (a rerun skips everything), and shards on Ray."""

from __future__ import annotations

import glob
import json
import tempfile

import pyarrow.parquet as pq
import pytest

from executor import Executor, ExecutorStep, read_status
from executor.dag.spec import InputName
from experiments import data_demo
from steps.corpora.real_corpus import RealCorpusConfig, build_real_corpus
from steps.data.documents import list_input_files, read_shard_table
from steps.dedup.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup


def kept_ids(output: str) -> set[str]:
    paths = list_input_files(f"{output}/docs")
    return {row for path in paths for row in read_shard_table(path).column("id").to_pylist()}


# Both Ray tests below fail fast when run after the rest of the suite (not when run alone) since this
# session's Ray backend changes; to be found and fixed under issue 8.
@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])],
)
def test_the_data_demo_runs_and_a_rerun_skips_everything(tmp_path, backend, request):
    if backend == "ray":
        import ray

        request.addfinalizer(ray.shutdown)  # later tests must not find a Ray to fan shards out to
    steps = data_demo.build_steps(docs_per_domain=40, near_copies=3)
    executor = Executor(str(tmp_path), backend=backend)
    executor.run(steps)
    assert all(read_status(executor.output_paths[step]) == "SUCCESS" for step in steps)
    final = json.loads(open(f"{executor.output_paths[steps[-1]]}/stats.json").read())
    assert 0 < final["docs_out"] < final["docs_in"]
    # Five documents per domain were quoted into the eval sets. Those the filters kept reach
    # decontamination (last) and are dropped there; no surviving document shares a 13-word n-gram with an item.
    by_name = {step.name: executor.output_paths[step] for step in steps}
    corpus_stats = json.loads(open(f"{by_name['raw/real_corpus']}/stats.json").read())
    leaked = {doc_id for domain in corpus_stats["domains"].values() for doc_id in domain["leaked_into_eval"]}
    dropped = {doc_id for path in glob.glob(f"{by_name['dedup/decontaminate']}/contaminated/*")
               for doc_id in pq.read_table(path).column("id").to_pylist()}  # fmt: skip
    reached = leaked & kept_ids(by_name["dedup/fuzzy"])
    assert len(leaked) == 15 and reached and reached <= dropped
    eval_grams = {gram for path in glob.glob(f"{by_name['raw/real_corpus']}/eval/*.jsonl")
                  for line in open(path) for gram in ngrams(json.loads(line)["text"], 13)}  # fmt: skip
    for path in glob.glob(f"{by_name['dedup/decontaminate']}/docs/*.parquet"):
        for text in pq.read_table(path, columns=["text"]).column("text").to_pylist():
            assert not ngrams(text, 13) & eval_grams
    again = Executor(str(tmp_path), backend=backend)
    rebuilt = data_demo.build_steps(docs_per_domain=40, near_copies=3)
    again.run(rebuilt)
    assert [again.decision_for(step).action for step in rebuilt] == ["skip"] * len(rebuilt)


def upstream(step: ExecutorStep) -> set[str]:
    """Names of every step `step` reads from, transitively (through its config's input paths)."""
    names: set[str] = set()
    pending = [step]
    while pending:
        for value in vars(pending.pop().config).values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, InputName) and item.step is not None and item.step.name not in names:
                    names.add(item.step.name)
                    pending.append(item.step)
    return names


def test_the_demo_filters_before_it_dedups():
    """Dedup keeps the first document of a cluster; a filter after it would lose clusters whose kept copy fails."""
    by_name = {step.name: step for step in data_demo.build_steps(docs_per_domain=40, near_copies=3)}
    assert {"quality/heuristics", "quality/fasttext_filter"} <= upstream(by_name["dedup/fuzzy"])
    assert not {"dedup/fuzzy", "dedup/decontaminate"} & upstream(by_name["quality/fasttext_filter"])


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = text.split()
    return {tuple(words[index : index + n]) for index in range(len(words) - n + 1)}


@pytest.mark.ray
def test_fuzzy_dedup_on_ray_matches_the_process_pool(tmp_path):
    import ray

    corpus = str(tmp_path / "corpus")
    build_real_corpus(RealCorpusConfig(output_path=corpus, docs_per_domain=30, near_copies=3))
    local = str(tmp_path / "local")
    fuzzy_dedup(FuzzyDedupConfig(input_paths=[f"{corpus}/raw"], output_path=local))
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    try:
        on_ray = str(tmp_path / "ray")
        fuzzy_dedup(FuzzyDedupConfig(input_paths=[f"{corpus}/raw"], output_path=on_ray))
    finally:
        ray.shutdown()
    assert kept_ids(on_ray) == kept_ids(local)
    assert json.loads(open(f"{on_ray}/stats.json").read())["docs_out"] == len(kept_ids(local))
