"""Retries and forced reruns: what is retried, how many attempts a run gets, and force_run of a
sharded step redoing every shard."""

from __future__ import annotations

import dataclasses
import errno
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray.exceptions
from botocore.exceptions import ClientError
from conftest import CALLS, make_step
from gcsfs.retry import HttpError
from s3fs.errors import translate_boto_error

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, StepFailedError, read_status
from executor.dag.records import verify_manifest
from executor.retry import DEFAULT_RETRY, RetryPolicy, is_transient
from executor.shards.runner import run_sharded
from executor.shards.writer import Shard, read_shard_markers
from executor.store.events import read_events


def client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetObject")  # fmt: skip


USER_BUGS = {
    "FileNotFoundError": FileNotFoundError(errno.ENOENT, "no such file", "/data/missing.jsonl"),
    "PermissionError": PermissionError(errno.EACCES, "permission denied", "/data/locked"),
    "IsADirectoryError": IsADirectoryError(errno.EISDIR, "is a directory", "/data"),
    "NotADirectoryError": NotADirectoryError(errno.ENOTDIR, "not a directory", "/data/file/x"),
    "s3 403": translate_boto_error(client_error(403, "AccessDenied")),
    "s3 404": translate_boto_error(client_error(404, "NoSuchKey")),
    "botocore 403": client_error(403, "AccessDenied"),
    "gcsfs 404": HttpError({"code": 404, "message": "no such object"}),
    "ValueError": ValueError("bad config"),
}
TRANSIENT = {
    "ConnectionResetError": ConnectionResetError(errno.ECONNRESET, "connection reset by peer"),
    "TimeoutError": TimeoutError("read timed out"),
    "gcsfs 503": HttpError({"code": 503, "message": "backend error"}),
    "gcsfs 429": HttpError({"code": 429, "message": "rate limit"}),
    "botocore 503": client_error(503, "SlowDown"),
    "s3 503": translate_boto_error(client_error(503, "SlowDown")),
    "s3 500": translate_boto_error(client_error(500, "InternalError")),
    "ray lost worker": ray.exceptions.WorkerCrashedError(),
    "ray lost node": ray.exceptions.NodeDiedError("node 1 died"),
}


@pytest.mark.parametrize("name", USER_BUGS)
def test_the_default_policy_does_not_retry_user_bugs(name):
    assert not DEFAULT_RETRY.should_retry(USER_BUGS[name], attempt=1)


@pytest.mark.parametrize("name", TRANSIENT)
def test_the_default_policy_retries_transient_io(name):
    assert DEFAULT_RETRY.should_retry(TRANSIENT[name], attempt=1)


@dataclass(frozen=True)
class RaiseConfig:
    name: str
    output_path: str
    error: str
    """Which exception the step raises (plain)."""


def raise_error(config: RaiseConfig) -> None:
    CALLS.record(config.name)
    if config.error == "missing":
        open(Path(config.output_path, "no", "such", "input.txt"))
    raise ConnectionResetError(errno.ECONNRESET, "connection reset by peer")


def test_a_missing_file_fails_the_step_at_once(tmp_path, calls):
    default_without_waits = dataclasses.replace(DEFAULT_RETRY, initial_backoff_s=0.01)
    step = ExecutorStep("reads_missing", raise_error, RaiseConfig("reads_missing", THIS_OUTPUT_PATH, "missing"),
                        retry=default_without_waits)  # fmt: skip
    with pytest.raises(StepFailedError, match="FileNotFoundError"):
        Executor(str(tmp_path)).run([step])
    assert calls.counts == {"reads_missing": 1}


def test_each_run_gets_the_full_retry_budget_and_attempts_are_numbered_across_runs(tmp_path, calls):
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.01)
    step = ExecutorStep("flaky", raise_error, RaiseConfig("flaky", THIS_OUTPUT_PATH, "reset"), retry=policy)
    for run in (1, 2):
        with pytest.raises(StepFailedError, match="ConnectionResetError"):
            Executor(str(tmp_path)).run([step])
        assert calls.counts == {"flaky": 2 * run}
    executor = Executor(str(tmp_path))
    executor.run([step], dry_run=True)
    history = [(event.status, event.attempt) for event in read_events(executor.output_paths[step])[1:]]
    assert history == [("RUNNING", 1), ("WAITING", 1), ("RUNNING", 2), ("FAILED", 2),
                       ("RUNNING", 3), ("WAITING", 3), ("RUNNING", 4), ("FAILED", 4)]  # fmt: skip


CODE = {"version": "old", "fail": ""}
"""Stands in for the shard function's source: editing it is a code change, which is not hashed."""
SHARD_RUNS: list[str] = []


def write_versioned_shard(shard_id: str, out) -> dict:
    SHARD_RUNS.append(shard_id)
    if shard_id == CODE["fail"]:
        raise ValueError(f"shard {shard_id} hit a bug")
    with out.open(f"parts/{shard_id}.txt") as handle:
        handle.write(f"{CODE['version']} {shard_id}\n".encode())
    return {"rows": 1}


@dataclass(frozen=True)
class PartsConfig:
    output_path: str


def write_parts(config: PartsConfig) -> None:
    shards = [Shard(f"{index}", f"{index}") for index in range(4)]
    run_sharded(config.output_path, shards, write_versioned_shard, parallelism="thread", max_workers=1)


def parts_text(output: str) -> list[str]:
    return [path.read_text() for path in sorted(Path(output, "parts").iterdir())]


def test_force_run_redoes_every_shard_and_a_resume_keeps_the_forced_runs_shards(tmp_path):
    step = ExecutorStep("parts", write_parts, PartsConfig(THIS_OUTPUT_PATH))
    CODE.update(version="old", fail="")
    first = Executor(str(tmp_path))
    first.run([step])
    output = first.output_paths[step]
    assert parts_text(output) == ["old 0\n", "old 1\n", "old 2\n", "old 3\n"]

    CODE.update(version="new", fail="3")  # the code changed, and its last shard has a bug
    SHARD_RUNS.clear()
    with pytest.raises(StepFailedError, match="shard 3 hit a bug"):
        Executor(str(tmp_path)).run([step], force_run=["parts"])
    assert SHARD_RUNS == ["0", "1", "2", "3"]
    assert parts_text(output)[:3] == ["new 0\n", "new 1\n", "new 2\n"]

    CODE.update(fail="")  # fixed; a plain rerun resumes the forced run: only the failed shard runs
    SHARD_RUNS.clear()
    Executor(str(tmp_path)).run([step])
    assert SHARD_RUNS == ["3"]
    assert parts_text(output) == ["new 0\n", "new 1\n", "new 2\n", "new 3\n"]
    assert read_status(output) == "SUCCESS" and verify_manifest(output) == []
    assert {marker["generation"] for marker in read_shard_markers(output).values()} == {2}


def test_a_lost_gcs_upload_session_is_transient_but_a_missing_file_is_not() -> None:
    session = "http://127.0.0.1:1/upload/storage/v1/b/bucket/o?name=x%2Fout.txt&uploadType=resumable&upload_id=7"
    assert is_transient(FileNotFoundError(session))
    assert not is_transient(FileNotFoundError("bucket/x/out.txt"))


def test_force_run_starts_from_an_empty_folder_and_a_resume_keeps_what_is_there(tmp_path, calls):
    step = make_step("stats", text="v1")
    executor = Executor(str(tmp_path))
    executor.run([step])
    output = Path(executor.output_paths[step])
    (output / "junk.txt").write_text("left by an older run")
    (output / "old_dir").mkdir()
    (output / "old_dir" / "part.bin").write_bytes(b"?")

    Executor(str(tmp_path)).run([step], force_run=["^stats$"])
    assert calls.counts == {"stats": 2}
    assert sorted(path.name for path in output.iterdir() if not path.name.startswith(".")) == ["logs", "out.txt"]
    assert verify_manifest(str(output)) == []
    manifest = json.loads((output / ".executor_manifest").read_text())
    assert [entry["path"] for entry in manifest["files"]] == ["out.txt"]
