"""The shard library: atomic commits with markers, resume of unfinished shards, progress, retries."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, storage
from executor.cli.commands import main as cli_main
from executor.dag.records import verify_manifest, write_manifest
from executor.retry import RetryPolicy
from executor.shards.runner import _ProcessPools, run_sharded
from executor.shards.writer import Shard, ShardFailedError, read_shard_markers
from executor.store.layout import SHARD_DIR, TEMP_DIR

RUNS: list[str] = []


def write_shard(payload: dict, out) -> dict:
    RUNS.append(payload["id"])
    if payload.get("fail"):
        raise ValueError(f"shard {payload['id']} is bad")
    with out.open(f"data/{payload['id']}.txt") as handle:
        handle.write(payload["text"].encode())
    with open(out.path(f"side/{payload['id']}.bin"), "wb") as handle:  # a library writing by path
        handle.write(b"\0" * len(payload["text"]))
    return {"rows": len(payload["text"].split())}


def shards_of(texts: list[str], failing: set[int] = frozenset()) -> list[Shard]:
    return [Shard(f"{i:03d}", {"id": f"{i:03d}", "text": text, "fail": i in failing}) for i, text in enumerate(texts)]


TEXTS = ["one two", "three four five", "six", "seven eight", "nine ten eleven twelve"]


def test_shards_commit_with_markers_and_the_manifest_reuses_their_checksums(tmp_path):
    RUNS.clear()
    output = str(tmp_path / "step")
    report = run_sharded(output, shards_of(TEXTS), write_shard, parallelism="thread")
    assert (report.total, report.skipped, report.ran) == (5, 0, 5)
    assert report.rows == 12 and report.bytes == 2 * sum(len(text) for text in TEXTS)
    assert Path(output, "data", "001.txt").read_text() == "three four five"
    assert not Path(output, TEMP_DIR).exists() or not any(Path(output, TEMP_DIR).iterdir())
    markers = read_shard_markers(output)
    assert sorted(markers) == ["000", "001", "002", "003", "004"]
    assert {entry["path"] for entry in markers["001"]["files"]} == {"data/001.txt", "side/001.bin"}
    progress = storage.read_json(storage.join(output, ".executor_progress"))
    assert progress["shards_done"] == progress["shards_total"] == 5 and progress["rows"] == 12
    # Same size, other bytes, after the commit: the manifest takes the marker's checksum (it does
    # not read the file again), and verify catches the change.
    Path(output, "data", "000.txt").write_text("ONE TWO")
    manifest = write_manifest(output)
    by_path = {entry["path"]: entry["sha256"] for entry in manifest["files"]}
    assert len(by_path) == 10
    assert by_path["data/000.txt"] == next(e["sha256"] for e in markers["000"]["files"] if e["path"] == "data/000.txt")
    assert [problem.split(":")[0] for problem in verify_manifest(output)] == ["corrupt"]


def test_a_rerun_redoes_only_the_shards_without_a_marker(tmp_path):
    RUNS.clear()
    output = str(tmp_path / "step")
    with pytest.raises(ShardFailedError, match=r"shard 002 of .* failed: ValueError\('shard 002 is bad'\)"):
        run_sharded(output, shards_of(TEXTS, failing={2}), write_shard, parallelism="thread", max_workers=1)
    committed = set(read_shard_markers(output))
    assert "002" not in committed and committed  # the good shards before it stay committed
    first_runs = list(RUNS)
    RUNS.clear()
    report = run_sharded(output, shards_of(TEXTS), write_shard, parallelism="thread")
    assert sorted(RUNS) == sorted({"000", "001", "002", "003", "004"} - committed)
    assert report.skipped == len(committed) and report.ran == 5 - len(committed)
    assert first_runs.count("002") == 1  # an application error is not retried


def test_transient_shard_failures_are_retried(tmp_path):
    seen: list[str] = []

    def flaky(payload: str, out) -> dict:
        seen.append(payload)
        if seen.count(payload) == 1:
            raise ConnectionResetError("connection reset by peer")
        with out.open(f"{payload}.txt") as handle:
            handle.write(b"ok")
        return {"rows": 1}

    report = run_sharded(
        str(tmp_path), [Shard("a", "a"), Shard("b", "b")], flaky, parallelism="thread",
        retry=RetryPolicy(initial_backoff_s=0.01),
    )  # fmt: skip
    assert report.ran == 2 and sorted(seen) == ["a", "a", "b", "b"]
    assert read_shard_markers(str(tmp_path))["a"]["attempts"] == 2


def test_bad_shard_lists_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must be unique"):
        run_sharded(str(tmp_path), [Shard("x"), Shard("x")], write_shard)
    with pytest.raises(ValueError, match="shard ids must be"):
        run_sharded(str(tmp_path), [Shard("../escape")], write_shard)


GATE = threading.Event()


@dataclass(frozen=True)
class GatedShardsConfig:
    output_path: str


def gated_shard(payload: int, out) -> dict:
    if payload >= 2:
        GATE.wait(60)
    with out.open(f"part-{payload}.txt") as handle:
        handle.write(b"x")
    return {"rows": 10}


def gated_step(config: GatedShardsConfig) -> None:
    run_sharded(config.output_path, [Shard(f"{i}", i) for i in range(5)], gated_shard, parallelism="thread",
                max_workers=1)  # fmt: skip


def test_progress_of_a_running_sharded_step_shows_in_status(tmp_path, capsys):
    GATE.clear()
    step = ExecutorStep("sharded", gated_step, GatedShardsConfig(THIS_OUTPUT_PATH))
    executor = Executor(str(tmp_path))
    runner = threading.Thread(target=executor.run, args=([step],))
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            cli_main(["status", str(tmp_path)])
            out = capsys.readouterr().out
            if "shards 2/5, 20 rows" in out:
                break
            assert time.monotonic() < deadline, out
            time.sleep(0.05)
        assert "RUNNING" in out
    finally:
        GATE.set()
        runner.join()
    assert len(read_shard_markers(executor.output_paths[step])) == 5
    assert sorted(p.name for p in Path(executor.output_paths[step], SHARD_DIR).iterdir())[0] == "0.json"


def test_the_manifest_skips_symlinks_and_lists_their_targets(tmp_path):
    """wandb leaves `wandb/latest-run` -> its run folder in a train step's output: the manifest must list the
    run's files once and not try to hash the link (IsADirectoryError failed the step after training)."""
    output = tmp_path / "train-abc"
    (output / "wandb" / "run-1").mkdir(parents=True)
    (output / "wandb" / "run-1" / "run.wandb").write_bytes(b"events")
    (output / "wandb" / "latest-run").symlink_to(output / "wandb" / "run-1", target_is_directory=True)
    manifest = write_manifest(str(output))
    assert [entry["path"] for entry in manifest["files"]] == ["wandb/run-1/run.wandb"]
    assert verify_manifest(str(output)) == []


def test_a_worker_pool_in_use_survives_an_environment_change(monkeypatch):
    """A step that changes the environment (the train step sets HF/wandb variables) must not shut down the
    pool another step's shards are running on; the old pool closes when its last user releases it."""
    pools = _ProcessPools()
    try:
        first = pools.acquire(1)
        monkeypatch.setenv("EXECUTOR_TEST_POOL_CONTEXT", "changed")
        second = pools.acquire(1)
        assert second is not first
        assert first.submit(abs, -3).result(timeout=120) == 3
        pools.release(first)
        with pytest.raises(RuntimeError, match="shutdown"):
            first.submit(abs, -3)
        assert second.submit(abs, -4).result(timeout=120) == 4
        pools.release(second)
    finally:
        pools.shutdown()


def test_a_local_pool_runs_no_more_shards_at_once_than_fit_in_memory(tmp_path):
    import os

    import sharded_steps

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert sharded_steps.ran_at_once(str(tmp_path / "free"), parallelism="thread", max_workers=3)
    assert not sharded_steps.ran_at_once(
        str(tmp_path / "budget"), parallelism="thread", max_workers=3, memory_bytes=int(0.6 * ram)
    )


def write_a_folder(payload: dict, out) -> dict:
    """A shard that leaves a whole folder (as a Levanter cache or a checkpoint does), written by path."""
    folder = out.folder(f"parts/{payload['id']}")
    for name, text in (("a.txt", "alpha"), ("deep/er/b.txt", "beta " * payload["n"])):
        storage.write_atomic(storage.join(folder, name), text)
    with out.open(f"single/{payload['id']}.txt") as handle:
        handle.write(b"one file")
    return {"rows": payload["n"]}


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_a_folder_is_committed_whole_replacing_a_half_committed_one(tmp_path, scheme):
    """`ShardWriter.folder`: the folder appears with all its files (one rename locally), every file is in the
    marker with its checksum, and a folder left by a commit killed before its marker was written is
    replaced, not merged with (its stale file would otherwise survive into the output)."""
    output = str(tmp_path / "step") if scheme == "local" else f"memory://shards-folder-{tmp_path.name}"
    storage.write_atomic(storage.join(output, "parts/001/stale.txt"), "from a killed commit")
    shards = [Shard(f"{i:03d}", {"id": f"{i:03d}", "n": i + 1}) for i in range(3)]
    report = run_sharded(output, shards, write_a_folder, parallelism="thread")
    assert report.ran == 3 and report.rows == 6
    assert storage.read_bytes(storage.join(output, "parts/001/stale.txt")) is None
    assert storage.read_bytes(storage.join(output, "parts/001/deep/er/b.txt")) == b"beta " * 2
    for shard_id, marker in read_shard_markers(output).items():
        files = {entry["path"]: entry for entry in marker["files"]}
        expected = [f"parts/{shard_id}/a.txt", f"parts/{shard_id}/deep/er/b.txt", f"single/{shard_id}.txt"]
        assert sorted(files) == expected
        for path, entry in files.items():
            assert entry["sha256"] == storage.sha256_file(storage.join(output, path))
            assert entry["size"] == len(storage.read_bytes(storage.join(output, path)))
    assert storage.walk_files(storage.join(output, TEMP_DIR)) == []
    write_manifest(output)
    assert verify_manifest(output) == []
