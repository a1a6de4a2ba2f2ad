"""The executor's core behaviour on every store: local files, memory://, GCS (emulator), S3 (moto)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

import fsspec
import pytest
from conftest import make_step, plant_crashed_holder, run_in_threads

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, StepFailedError, output_path_of, read_status, storage
from executor.dag.explain import explain_output
from executor.dag.records import verify_manifest
from executor.store.events import read_events
from executor.store.lease import Lease, LeaseSettings


@pytest.fixture(params=["local", "memory", pytest.param("gcs", marks=pytest.mark.gcs),
                        pytest.param("s3", marks=pytest.mark.s3)])  # fmt: skip
def prefix(request, tmp_path) -> str:
    root = {
        "local": lambda: str(tmp_path),
        "memory": lambda: "memory://stores-test",
        "gcs": lambda: request.getfixturevalue("gcs_emulator"),
        "s3": lambda: request.getfixturevalue("s3_server"),
    }[request.param]()
    return f"{root}/{uuid.uuid4().hex[:10]}"


def test_runs_in_order_records_everything_and_skips_on_rerun(prefix, calls):
    a = make_step("a", text="A")
    b = make_step("b", a, text="B")
    c = make_step("c", a, b, text="C")
    executor = Executor(prefix)
    executor.run([c])
    output = executor.output_paths[c]
    assert storage.read_text(output + "/out.txt") == "C+A+B+A"
    assert [event.status for event in read_events(output)] == ["WAITING", "RUNNING", "SUCCESS"]
    info = storage.read_json(output + "/.executor_info")
    assert info["version"] == executor.versions[c] and info["output_path"] == output
    assert verify_manifest(output) == []
    assert [step["name"] for step in storage.read_json(executor.executor_info_path)["steps"]] == ["a", "b", "c"]
    Executor(prefix).run([c])
    assert calls.counts == {"a": 1, "b": 1, "c": 1}


def test_failures_run_only_force_run_and_pseudo_dependencies(prefix, calls):
    bad = make_step("bad", fail=True)
    child = make_step("child", bad)
    good = make_step("good")
    pseudo = make_step("pseudo")
    user = make_step("user", good, nonblocking=[pseudo])
    executor = Executor(prefix)
    with pytest.raises(StepFailedError, match=r"^1 step\(s\) failed: bad-"):
        executor.run([child, user])
    assert read_status(executor.output_paths[child]) == "DEP_FAILED"
    assert read_status(executor.output_paths[user]) == "SUCCESS"
    assert read_status(executor.output_paths[pseudo]) is None
    Executor(prefix).run([child, user], run_only=["^good$"], force_run=["^good$"])
    assert calls.counts == {"bad": 1, "good": 2, "user": 1}


def test_concurrent_executors_run_each_step_once(prefix, calls, fast_leases):
    if prefix.startswith("gs://"):
        pytest.skip("the GCS emulator ignores ifGenerationMatch=0, so exclusive create is not exclusive there")
    d = make_step("d", make_step("c", make_step("b", make_step("a"))))
    errors = run_in_threads(4, lambda: Executor(prefix).run([d]))
    assert errors == [] and calls.counts == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_a_stale_lease_is_taken_over_and_explain_diffs_versions(prefix, calls, fast_leases):
    old, new = make_step("s", text="old"), make_step("s", text="new")
    Executor(prefix).run([old])
    probe = Executor(prefix)
    probe.run([new], dry_run=True)
    output = probe.output_paths[new]
    plant_crashed_holder(output)
    Executor(prefix).run([new])
    assert [(e.status, e.attempt) for e in read_events(output)] == [("RUNNING", 1), ("RUNNING", 2), ("SUCCESS", 2)]
    assert Lease(output, "observer", LeaseSettings()).current()["number"] == 1
    [other] = explain_output(output).others
    assert [(d.key, d.other, d.this) for d in other.differences] == [("config.text", "old", "new")]


def _write_from_another_thread(path: str, text: str) -> None:
    """A write by another worker: fsspec gives each thread its own client (and listing cache)."""
    writer = threading.Thread(target=lambda: storage.write_atomic(path, text))
    writer.start()
    writer.join()


def test_the_executors_listings_never_hide_a_file_written_later(prefix):
    # A worker waiting for step `a` lists a's empty lease folder while a's folder holds only its WAITING
    # status; s3fs then lists and caches a's folder. a's output, written later by another worker, must
    # still be found by that worker when it runs a's dependent.
    a = f"{prefix}/a"
    storage.write_atomic(f"{a}/.executor_status", "{}\n")
    assert storage.list_names(f"{a}/.executor_lease") == []
    _write_from_another_thread(f"{a}/out.txt", "A")
    with fsspec.open(f"{a}/out.txt", "r") as handle:
        assert handle.read() == "A"
    # The manifest's walk caches every folder it walked.
    storage.write_atomic(f"{a}/sub/old.txt", "old")
    assert [relative for relative, _ in storage.walk_files(a)] == [".executor_status", "out.txt", "sub/old.txt"]
    _write_from_another_thread(f"{a}/sub/new.txt", "new")
    assert fsspec.open(f"{a}/sub/new.txt", "r").open().read() == "new"


@dataclass(frozen=True)
class ListConfig:
    folder: str


def list_then_let_another_worker_write(config: ListConfig) -> None:
    fs, path = fsspec.core.url_to_fs(config.folder)
    listed = [name.rsplit("/", 1)[-1] for name in fs.ls(path, detail=False)]  # user code; the client caches it
    assert listed == ["old.txt"]
    _write_from_another_thread(f"{config.folder}/new.txt", "new")


@dataclass(frozen=True)
class ReadConfig:
    path: str
    output_path: str
    after: str
    """The lister's output: a dependency, so the reader runs second."""


def read_into_output(config: ReadConfig) -> None:
    storage.write_atomic(f"{config.output_path}/copy.txt", fsspec.open(config.path, "r").open().read())


def test_each_step_starts_with_no_cached_listing(prefix):
    # Both steps run in the one worker thread (max_concurrent=1), so they share its fsspec client: the
    # first step's listing must not make the second step miss a file written in between.
    folder = f"{prefix}/shared"
    storage.write_atomic(f"{folder}/old.txt", "old")
    lister = ExecutorStep(name="lister", fn=list_then_let_another_worker_write, config=ListConfig(folder))
    reader = ExecutorStep(
        name="reader",
        fn=read_into_output,
        config=ReadConfig(f"{folder}/new.txt", THIS_OUTPUT_PATH, output_path_of(lister)),
    )
    executor = Executor(prefix)
    executor.run([reader], max_concurrent=1)
    assert storage.read_text(executor.output_paths[reader] + "/copy.txt") == "new"
