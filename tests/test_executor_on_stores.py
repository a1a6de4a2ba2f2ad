"""The executor's core behaviour on every store: local files, memory://, GCS (emulator), S3 (moto)."""

from __future__ import annotations

import uuid

import pytest
from conftest import make_step, plant_crashed_holder, run_in_threads

from executor import Executor, StepFailedError, read_status, storage
from executor.explain import explain_output
from executor.lease import Lease, LeaseSettings
from executor.records import verify_manifest
from executor.status import read_events


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
