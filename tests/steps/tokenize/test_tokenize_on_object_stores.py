"""The tokenize step's Levanter caches on object stores: the step runs through the executor under an
s3:// prefix on moto and a gs:// prefix on the GCS emulator, tensorstore's own S3 and GCS clients write the
arrays, and Levanter's trainer path (`LmDataConfig.build_caches`, no auto-build) reads back exactly the ids
of the same step run locally.

Tensorstore has its own HTTP clients. On S3, Levanter's spec takes the endpoint from AWS_ENDPOINT_URL and
addresses the bucket virtual-hosted style, as `<bucket>.<endpoint host>`: the tests reach moto as
`localhost` (curl resolves `*.localhost` to loopback), and an endpoint given by IP address is refused up
front. On GCS, TENSORSTORE_GCS_HTTP_URL points it at the emulator, which tests/support/gcs_emulator.py gives the
generation headers and suffix byte ranges of real GCS that tensorstore relies on."""

from __future__ import annotations

import os
import uuid

import pytest

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, storage, versioned
from executor.dag.plan import build_plan
from experiments.defaults import TokenizedCache, lm_mixture_data_config
from steps.corpora.text_corpus import TextCorpusConfig, build_text_corpus
from steps.tokenize.levanter_cache import UnsupportedCachePathError
from steps.tokenize.tokenize import SPLITS, TokenizeConfig, tokenize
from steps.tokenize.train_tokenizer import TrainTokenizerConfig, train_tokenizer


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Real text: 12 stdlib modules in three JSONL.gz shards."""
    output_path = str(tmp_path_factory.mktemp("corpus"))
    build_text_corpus(TextCorpusConfig(source="python_stdlib", max_docs=12, docs_per_shard=4, output_path=output_path))
    return output_path


@pytest.fixture(scope="module")
def tokenizer_path(inputs: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    output_path = str(tmp_path_factory.mktemp("tokenizer"))
    config = TrainTokenizerConfig(input_paths=[inputs], vocab_size=500, sample_bytes=200_000, output_path=output_path)
    train_tokenizer(config)
    return output_path


def tokenize_step(inputs: str, tokenizer_path: str) -> ExecutorStep:
    config = TokenizeConfig(
        input_paths=[f"{inputs}/shard-*.jsonl.gz"],
        tokenizer_path=tokenizer_path,
        validation_fraction=versioned(0.25),
        parallelism="thread",
        output_path=THIS_OUTPUT_PATH,
    )
    return ExecutorStep(name="tokenized/stores", fn=tokenize, config=config)


def run_step(prefix: str, step: ExecutorStep) -> str:
    executor = Executor(prefix)
    executor.run([step])
    return executor.output_paths[step]


def trainer_rows(cache_dir: str, tokenizer_path: str) -> dict[str, list[list[int]]]:
    """Each split's documents as Levanter's trainer loads the caches of a mixture (auto_build_caches off)."""
    mixture = lm_mixture_data_config({"docs": TokenizedCache(cache_dir, tokenizer_path)}, {"docs": 1.0})
    train = ExecutorStep(name="train", fn=print, config=mixture)
    data = build_plan([train], cache_dir).lookup(train).config  # as a train step receives it: versions resolved
    rows = {}
    for split in SPLITS:
        cache = data.build_caches(split)["docs"]
        rows[split] = [row["input_ids"].tolist() for row in cache.get_batch_sync(list(range(len(cache))))]
    return rows


@pytest.fixture(params=[pytest.param("s3", marks=pytest.mark.s3), pytest.param("gcs", marks=pytest.mark.gcs)])
def remote_prefix(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh folder in a bucket on a local server, with tensorstore's client pointed at it: on S3 through
    AWS_ENDPOINT_URL naming moto `localhost`; on GCS through TENSORSTORE_GCS_HTTP_URL."""
    if request.param == "s3":
        bucket = request.getfixturevalue("s3_server")
        monkeypatch.setenv("AWS_ENDPOINT_URL", os.environ["AWS_ENDPOINT_URL"].replace("127.0.0.1", "localhost"))
    else:
        bucket = request.getfixturevalue("gcs_emulator")
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", os.environ["EXECUTOR_TEST_GCS_URL"])
    return f"{bucket}/{uuid.uuid4().hex[:10]}"


def test_a_cache_on_an_object_store_reads_back_in_levanter_as_the_local_one(
    remote_prefix, inputs, tokenizer_path, tmp_path
):
    step = tokenize_step(inputs, tokenizer_path)
    remote = run_step(remote_prefix, step)
    local = run_step(str(tmp_path), step)
    assert remote.startswith(remote_prefix + "/") and storage.basename(remote) == storage.basename(local)
    stored = {name for name, _size in storage.walk_files(remote)}
    assert {"train/shard_ledger.json", "validation/shard_ledger.json"} <= stored
    assert "train/part-00000-00002/input_ids/data/zarr.json" in stored, "the arrays are not in the bucket"

    remote_rows, local_rows = trainer_rows(remote, tokenizer_path), trainer_rows(local, tokenizer_path)
    assert len(remote_rows["train"]) + len(remote_rows["validation"]) == 12
    assert remote_rows["train"] and remote_rows["validation"]
    assert remote_rows == local_rows


def test_an_s3_endpoint_given_by_ip_address_is_refused_before_any_work(tokenizer_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    config = TokenizeConfig(["s3://bucket/docs"], tokenizer_path, output_path="s3://bucket/tokenized")
    endpoint = r"AWS_ENDPOINT_URL=http://127\.0\.0\.1:9000.*<bucket>\.127\.0\.0\.1.*host name"
    expected = rf"tokenize \(s3://bucket/tokenized\).*{endpoint}"
    with pytest.raises(UnsupportedCachePathError, match=expected):
        tokenize(config)
