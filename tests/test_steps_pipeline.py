"""The data steps as a DAG: the data demo end to end (a rerun skips everything), and shards on Ray."""

from __future__ import annotations

import json
import tempfile

import pytest

from executor import Executor, read_status
from experiments import data_demo
from steps.dedup_fuzzy import FuzzyDedupConfig, fuzzy_dedup
from steps.documents import list_input_files, read_shard_table
from steps.real_corpus import RealCorpusConfig, build_real_corpus


def kept_ids(output: str) -> set[str]:
    paths = list_input_files(f"{output}/docs")
    return {row for path in paths for row in read_shard_table(path).column("id").to_pylist()}


@pytest.mark.slow
def test_the_data_demo_runs_and_a_rerun_skips_everything(tmp_path):
    steps = data_demo.build_steps(docs_per_domain=40, near_copies=3)
    executor = Executor(str(tmp_path))
    executor.run(steps)
    assert all(read_status(executor.output_paths[step]) == "SUCCESS" for step in steps)
    final = json.loads(open(f"{executor.output_paths[steps[-1]]}/stats.json").read())
    assert 0 < final["docs_out"] < final["docs_in"]
    again = Executor(str(tmp_path))
    rebuilt = data_demo.build_steps(docs_per_domain=40, near_copies=3)
    again.run(rebuilt)
    assert [again.decision_for(step).action for step in rebuilt] == ["skip"] * len(rebuilt)


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
