"""Same hash, same bytes (issue 37): each step's output digest, recorded at commit and shown by `status` and
`explain`; `compare` of two prefixes; pins that fail loudly."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import make_step

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, StepFailedError, storage, versioned
from executor.cli.commands import main as cli_main
from executor.dag.pins import PinError
from executor.dag.records import verify_manifest
from executor.shards.runner import run_sharded
from executor.shards.writer import Shard, ShardWriter
from executor.store.events import read_events
from executor.watch.step_view import step_detail


def _digest_from_disk(output_path: Path) -> str:
    """The output digest recomputed from the files themselves, as the issue defines it: sha256 over the canonical
    JSON of (path, size, sha256), sorted by path, the executor's own records left out."""
    entries = []
    for path in sorted(output_path.rglob("*")):
        relative = path.relative_to(output_path).as_posix()
        if path.is_file() and not relative.startswith((".executor_", "logs/")):
            entries.append({"path": relative, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                            "size": path.stat().st_size})  # fmt: skip
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_each_success_records_its_output_digest_and_status_and_explain_show_it(tmp_path: Path, capsys) -> None:
    """The SUCCESS event carries the digest of the bytes written (recomputed here from the files), the same under
    two prefixes, written at different times; `status` shows its first 12 characters, `explain` and the step
    page's JSON all of it."""
    corpus = make_step("corpus", text="alpha")
    steps = [corpus, make_step("tokens", corpus, text="beta")]
    digests = {}
    for prefix in ("a", "b"):
        executor = Executor(str(tmp_path / prefix))
        executor.run(steps)
        for step in steps:
            output = Path(executor.output_paths[step])
            success = read_events(str(output))[-1]
            assert success.status == "SUCCESS"
            assert success.details["output_digest"] == _digest_from_disk(output)
            manifest = json.loads((output / ".executor_manifest").read_text())
            assert manifest["digest"] == success.details["output_digest"]
            digests[prefix, step.name] = success.details["output_digest"]
    assert digests["a", "corpus"] == digests["b", "corpus"] != digests["a", "tokens"] == digests["b", "tokens"]
    capsys.readouterr()
    assert cli_main(["status", str(tmp_path / "a")]) == 0
    shown = capsys.readouterr().out
    assert "digest" in shown and digests["a", "corpus"][:12] in shown and digests["a", "tokens"][:12] in shown
    tokens = Path(Executor(str(tmp_path / "a")).explain(steps[1]).output_path)
    page = step_detail(str(tmp_path / "a"), tokens.name, str(tokens), None)  # the dashboard's and the site's step page
    assert page["output_digest"] == digests["a", "tokens"]
    assert cli_main(["explain", str(tmp_path / "a"), "^tokens$"]) == 0
    assert f"output digest: sha256 of the canonical manifest (paths, sizes, sha256s) = {digests['a', 'tokens']}" in (
        capsys.readouterr().out
    )


@dataclass(frozen=True)
class MetricsConfig:
    output_path: str
    steps: int = versioned(3)
    scale: float = 1.0
    """Not versioned: two runs that differ only here have the same hash and different bytes, as two CPU types do."""


def write_metrics(config: MetricsConfig) -> None:
    out = Path(config.output_path)
    out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "train/loss": 4.0 / (step + 1) * (config.scale if step else 1.0)})
             for step in range(config.steps)]  # fmt: skip
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (out / "weights.bin").write_bytes(b"\0" * 64)


def _metrics_step(scale: float) -> ExecutorStep:
    return ExecutorStep(name="train/toy", fn=write_metrics, config=MetricsConfig(THIS_OUTPUT_PATH, scale=scale))


def _compare(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli_main(["compare", *args])
    return code, capsys.readouterr().out


def test_compare_gives_each_step_one_of_four_outcomes_and_exits_1_on_same_hash_different_bytes(tmp_path, capsys):
    """Same DAG under A and B: every shared step `same`; a step run only under A or only under B says so; a file
    edited under B after its step committed makes that step DIFFERENT (exit 1), naming the file and the manifest it
    no longer matches; `--experiment` keeps to that experiment's steps; `--recorded` trusts the digests recorded."""
    corpus = make_step("corpus", text="alpha")
    shared = [corpus, make_step("tokens", corpus, text="beta")]
    a, b = tmp_path / "a", tmp_path / "b"
    Executor(str(a)).run([*shared, make_step("extra_a", text="a")])
    run_b = Executor(str(b))
    run_b.run([*shared, make_step("extra_b", text="b")])
    code, out = _compare(capsys, str(a), str(b))
    assert code == 0, out
    outcomes = {line.split()[-1 if "only" in line else 1].rsplit("-", 1)[0]: line.split("  ")[0].strip()
                for line in out.splitlines() if line.startswith(("same", "only", "DIFFERENT"))}  # fmt: skip
    assert outcomes == {"corpus": "same", "tokens": "same", "extra_a": "only in A", "extra_b": "only in B"}, out
    assert "4 step(s): 2 same, 0 DIFFERENT, 1 only in A, 1 only in B" in out

    tampered = Path(run_b.output_paths[shared[1]]) / "out.txt"
    tampered.write_text(tampered.read_text() + "!")
    code, out = _compare(capsys, str(a), str(b))
    assert code == 1, out
    assert f"DIFFERENT  tokens-{Path(run_b.output_paths[shared[1]]).name.rsplit('-', 1)[1]}" in out
    assert "out.txt: differs" in out and "B: out.txt no longer match(es) its manifest" in out
    assert "same hash, different results" in out
    code, out = _compare(capsys, str(a), str(b), "--recorded")
    assert code == 0, out  # the recorded digests agree: only reading the files finds the edit

    experiment = next((b / "experiments").glob("*.json"))
    code, out = _compare(capsys, str(a), str(b), "--experiment", str(experiment))
    assert code == 1 and "extra_a" not in out and "only in B" in out and "3 step(s)" in out, out


def test_compare_shows_the_first_differing_metrics_line_and_rtol_quantifies_the_drift(tmp_path, capsys):
    """Two runs of one train step whose losses differ by 2e-7 relative (a CPU type's rounding): byte comparison
    finds them DIFFERENT and shows metrics.jsonl's first differing line; `--rtol 1e-5` finds them equal within
    the tolerance and says by how much they differ; `--rtol 1e-8` does not. Bytes that are not JSON never pass."""
    a, b = tmp_path / "a", tmp_path / "b"
    Executor(str(a)).run([_metrics_step(1.0)])
    Executor(str(b)).run([_metrics_step(1.0 + 2e-7)])
    code, out = _compare(capsys, str(a), str(b))
    assert code == 1 and "metrics.jsonl: differs; first differing line 2: A {" in out, out
    assert "weights.bin" not in out  # identical, so not listed
    code, out = _compare(capsys, str(a), str(b), "--rtol", "1e-5")
    assert code == 0 and "equal within rtol: largest relative difference 2e-07" in out, out
    code, out = _compare(capsys, str(a), str(b), "--rtol", "1e-8")
    assert code == 1, out
    (Path(next((b / "train").iterdir())) / "weights.bin").write_bytes(b"\1" * 64)
    code, out = _compare(capsys, str(a), str(b), "--rtol", "0.5")
    assert code == 1 and "weights.bin: differs" in out, out
    assert cli_main(["compare", str(a), str(tmp_path / "nowhere")]) == 2


def _run(prefix: Path, steps: list[ExecutorStep], **kwargs) -> Executor:
    executor = Executor(str(prefix))
    executor.run(steps, caller="/somewhere/toy.py", **kwargs)
    return executor


def test_pin_writes_name_hash_and_digest_beside_the_experiment_and_a_drifted_hash_stops_the_run(tmp_path, capsys):
    """`pin toy.py` finds the newest experiment of toy.py under the prefix and writes toy.pins.json beside the
    script; a run given it whose pinned step has another hash (its versioned config changed, and so its
    dependent's) is refused before anything is written, naming both hashes; the dry run marks the pinned steps."""
    corpus = make_step("corpus", text="alpha")
    steps = [corpus, make_step("tokens", corpus, text="beta")]
    done = _run(tmp_path / "a", steps)
    script = tmp_path / "toy.py"
    assert cli_main(["pin", str(script), "--prefix", str(tmp_path / "a")]) == 0
    assert "pinned 2 step(s)" in capsys.readouterr().out
    pins = json.loads((tmp_path / "toy.pins.json").read_text())
    expected = [{"name": step.name, "hash": Path(done.output_paths[step]).name.rsplit("-", 1)[1],
                 "output_digest": read_events(done.output_paths[step])[-1].details["output_digest"]} for step in steps]
    assert [{**pin, "hash": pin["hash"][:8]} for pin in pins["steps"]] == expected  # fmt: skip

    drifted = make_step("corpus", text="ALPHA")
    with pytest.raises(PinError, match=r"2 step\(s\) drifted .* nothing was run or written: corpus: pinned hash "
                                       r"\w+…, this DAG's \w+… \(python -m executor explain .*; tokens: "):  # fmt: skip
        _run(tmp_path / "b", [drifted, make_step("tokens", drifted, text="beta")], pins=str(tmp_path / "toy.pins.json"))
    assert not (tmp_path / "b").exists()
    capsys.readouterr()
    _run(tmp_path / "c", steps, pins=str(tmp_path / "toy.pins.json"), dry_run=True)
    out = capsys.readouterr().out
    assert "2 step(s) pinned by" in out and out.count("[pinned: digest ") == 2, out
    assert not (tmp_path / "c").exists()


def test_a_pinned_step_committing_other_bytes_is_failed_with_both_digests_and_its_output_kept(tmp_path) -> None:
    """The pinned train step rerun elsewhere writes losses 1e-7 apart: FAILED, not SUCCESS, both digests in the
    error and the status, its files left where they are; the step downstream of it never runs."""
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a, [_metrics_step(1.0)])
    assert cli_main(["pin", str(next((a / "experiments").glob("*.json"))), "--to", str(tmp_path / "pins.json")]) == 0
    pinned = json.loads((tmp_path / "pins.json").read_text())["steps"][0]["output_digest"]
    other = _metrics_step(1.0 + 1e-7)
    after = make_step("report", other)
    with pytest.raises(StepFailedError) as failure:
        _run(b, [other, after], pins=str(tmp_path / "pins.json"))
    output = next((b / "train").iterdir())
    last = read_events(str(output))[-1]
    assert last.status == "FAILED" and pinned in last.message and "is not the pinned" in last.message
    found = json.loads((output / ".executor_manifest").read_text())["digest"]
    assert found != pinned and f"output digest {found} is not the pinned {pinned}" in str(failure.value)
    assert (output / "metrics.jsonl").exists() and "kept for inspection" in last.message
    assert failure.value.dep_failed and not list(b.glob("report-*/out.txt"))


def test_a_file_edited_after_commit_fails_the_pinned_run_before_any_step_runs(tmp_path) -> None:
    """A pinned, finished step whose shard was edited since: the run re-reads it, records FAILED (output kept)
    and stops before the new step downstream runs; without the pin file the run would have skipped it."""
    corpus = make_step("corpus", text="alpha")
    done = _run(tmp_path, [corpus])
    experiment = next((tmp_path / "experiments").glob("*.json"))
    assert cli_main(["pin", str(experiment), "--to", str(tmp_path / "p.json")]) == 0
    shard = Path(done.output_paths[corpus]) / "out.txt"
    shard.write_text("tampered")
    later = make_step("later", corpus, text="z")
    with pytest.raises(StepFailedError, match=r"1 pinned step\(s\) hold other bytes than their pins; nothing was run"):
        _run(tmp_path, [corpus, later], pins=str(tmp_path / "p.json"))
    assert read_events(done.output_paths[corpus])[-1].status == "FAILED" and shard.read_text() == "tampered"
    assert not list(tmp_path.glob("later-*"))


@dataclass(frozen=True)
class NestedConfig:
    output_path: str
    shards: int = versioned(3)


def _nested_part(shard_id: str, out: ShardWriter) -> dict:
    with out.open(f"parts/{shard_id}.txt") as handle:
        handle.write(f"shard {shard_id}\n".encode())
    return {"rows": 1}


def nested_stage(config: NestedConfig) -> None:
    """Shards committed under work/parts/ (its markers and progress nested there), as the dedup steps do."""
    shards = [Shard(f"{index:02d}", f"{index:02d}") for index in range(config.shards)]
    run_sharded(storage.join(config.output_path, "work/parts"), shards, _nested_part, parallelism="thread")


def test_a_nested_sharded_stages_markers_are_the_executors_and_stay_out_of_the_digest(tmp_path) -> None:
    """The shard markers and progress of a stage under work/ hold times and worker ids: two runs write them
    differently, yet the manifests list only the shards themselves and the digests agree (the data demo's dedup
    and filter steps differed on the local and the Ray backend by nothing else)."""
    step = ExecutorStep(name="nested", fn=nested_stage, config=NestedConfig(THIS_OUTPUT_PATH))
    outputs = [Path(_run(tmp_path / prefix, [step]).output_paths[step]) for prefix in ("a", "b")]
    markers = [sorted((output / "work/parts/.executor_shards").glob("*.json")) for output in outputs]
    assert len(markers[0]) == 3 and markers[0][0].read_bytes() != markers[1][0].read_bytes()
    manifests = [json.loads((output / ".executor_manifest").read_text()) for output in outputs]
    assert [entry["path"] for entry in manifests[0]["files"]] == [f"work/parts/parts/{i:02d}.txt" for i in range(3)]
    assert manifests[0]["digest"] == manifests[1]["digest"] == read_events(str(outputs[1]))[-1].details["output_digest"]
    assert verify_manifest(str(outputs[0])) == []


@pytest.mark.parametrize(
    ("path", "start", "recorded"),
    [
        ("/data/p/raw/kjv-abc/files", "/data/p/download/kjv-def", "../../raw/kjv-abc/files"),
        ("file:///data/p/raw/kjv-abc", "/data/p/download/kjv-def", "../../raw/kjv-abc"),
        ("gs://b/p/raw/kjv-abc/x.parquet", "gs://b/p/download/kjv-def", "../../raw/kjv-abc/x.parquet"),
        ("gs://other/raw/kjv-abc", "gs://b/p/download/kjv-def", "gs://other/raw/kjv-abc"),
        ("s3://b/p/raw/kjv-abc", "gs://b/p/download/kjv-def", "s3://b/p/raw/kjv-abc"),
        ("https://example.org/kjv/", "/data/p/download/kjv-def", "https://example.org/kjv/"),
        ("gs://b/p/raw/kjv-abc", "/data/p/download/kjv-def", "gs://b/p/raw/kjv-abc"),
    ],
)
def test_a_path_in_the_outputs_own_store_is_recorded_relative_to_it_and_resolves_back(path, start, recorded) -> None:
    """What makes a download's manifest and a cache ledger the same bytes under another prefix: a path in the
    same store (disk, or one bucket) relative to the output, any other unchanged; resolving gives the path back."""
    assert storage.portable_path(path, start) == recorded
    back = storage.resolve_portable(recorded, start)
    assert back == (path.removeprefix("file://") if recorded != path else path)
    moved = start.replace("/p/", "/q/")
    if recorded != path:  # the same text names the same step's output under the moved prefix
        assert storage.resolve_portable(recorded, moved) == back.replace("/p/", "/q/")
