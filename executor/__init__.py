"""A content-hashed DAG executor: every step's output lives at `<prefix>/<name>-<hash>`.

A step is a function of a frozen config dataclass. Fields marked `versioned(...)` and the
versions of the steps it depends on make up the step's *version*; its hash names the output
path, so changing a versioned value (or anything upstream) gives a new path and reruns, while
unversioned fields (thread counts, log levels) never do. The prefix, backend and resources never
enter the hash: the same DAG under `gs://bucket` and `./outputs` has the same hashes.

Worked example, A -> B -> C:

    @dataclass(frozen=True)
    class DownloadConfig:
        url: str                        # versioned below
        output_path: str                # filled in at run time

    @dataclass(frozen=True)
    class TokenizeConfig:
        input_path: str
        output_path: str
        tokenizer: str
        num_threads: int = 8            # plain: not hashed, changing it reruns nothing

    download = ExecutorStep(                                          # A
        name="download", fn=download_fn,
        config=DownloadConfig(url=versioned("https://example.com/x.jsonl"), output_path=THIS_OUTPUT_PATH),
    )
    tokenize = ExecutorStep(                                          # B
        name="tokenize", fn=tokenize_fn,
        config=TokenizeConfig(
            input_path=output_path_of(download, "docs"),              # a dependency: hashed
            output_path=THIS_OUTPUT_PATH, tokenizer=versioned("gpt2"),
        ),
    )
    train = ExecutorStep(name="train", fn=train_fn, config=TrainConfig(data=tokenize / "tokens", ...))  # C
    executor_main([train])

`download`'s version is `{"name": "download", "config": {"url": "https://..."}, "dependencies": [],
"code_version": null}`; its hash is the sha256 of that dict's canonical JSON and its path is
`<prefix>/download-<first 8 hex>`. `tokenize`'s version holds `"input_path": "DEP[0]/docs"` and
`download`'s name and hash in `dependencies`, so a new URL gives A, B and C new paths, while
changing `num_threads` changes nothing. `tokenize_fn` receives
`TokenizeConfig(input_path="<prefix>/download-1a2b3c4d/docs", output_path="<prefix>/tokenize-...", ...)`.

Running `executor_main` skips every step whose output is SUCCESS, runs the rest in dependency
order, and resumes after a failure; see docs/running.md for the CLI and docs/concepts.md
for the storage layout and leases.

What a step function may use, all from this package (`steps/` and `experiments/` import nothing else of
it; import-linter checks that in `make test`): `storage` (every read and write, on any store), `layout`
(the names of the files a step folder holds), `run_sharded` / `Shard` / `ShardWriter` (fan out over shards,
each committed on its own), `MetricsLog` (a live `metrics.jsonl` on any store;
`metric_json`, how a value is recorded in it), `progress` (how far a long
loop got, for a gang's watch), `recorded_path` (a path as the step records it), `TransientError` (a failure
worth retrying) and the errors. The rooms below are the library's own: `store/`, `dag/`, `shards/`, `run/`,
`watch/`, `cli/` (docs/contributing.md).
"""

from executor.cli.error_report import install_excepthook
from executor.cli.executor_main import ExecutorMainConfig, executor_main
from executor.dag.records import recorded_path
from executor.dag.spec import (
    THIS_OUTPUT_PATH,
    ExecutorStep,
    InputName,
    OutputName,
    ResourceConfig,
    StepFunction,
    VersionedValue,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.errors import (
    ConfigError,
    CycleError,
    ExecutorError,
    LeaseLostError,
    StepFailedError,
    StorageError,
    UnversionableValueError,
)
from executor.retry import RetryPolicy, TransientError
from executor.run import gang_progress as progress
from executor.run.executor import Executor
from executor.shards.runner import ShardReport, run_sharded
from executor.shards.writer import Shard, ShardFn, ShardWriter
from executor.store import layout, storage
from executor.store.events import StatusEvent, StepStatus, read_events, read_status
from executor.store.metrics_log import FLUSH_SECONDS as METRICS_FLUSH_SECONDS
from executor.store.metrics_log import MetricsLog, metric_json, read_metrics_bytes

__all__ = [
    "METRICS_FLUSH_SECONDS",
    "THIS_OUTPUT_PATH",
    "ConfigError",
    "CycleError",
    "Executor",
    "ExecutorError",
    "ExecutorMainConfig",
    "ExecutorStep",
    "InputName",
    "LeaseLostError",
    "MetricsLog",
    "OutputName",
    "ResourceConfig",
    "RetryPolicy",
    "Shard",
    "ShardFn",
    "ShardReport",
    "ShardWriter",
    "StatusEvent",
    "StepFailedError",
    "StepFunction",
    "StepStatus",
    "StorageError",
    "TransientError",
    "UnversionableValueError",
    "VersionedValue",
    "executor_main",
    "install_excepthook",
    "layout",
    "metric_json",
    "output_path_of",
    "progress",
    "read_events",
    "read_metrics_bytes",
    "read_status",
    "recorded_path",
    "run_sharded",
    "storage",
    "this_output_path",
    "versioned",
]
