"""`compare` judges results, not bytes a run cannot repeat: measured times, the prefix written into an output, a
checkpoint database's random file names and wandb's run records are set aside, each named; a changed weight or a
changed loss is still DIFFERENT, and `--bytes` asks for the same bytes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorstore

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.cli.commands import main as cli_main
from executor.dag.records import cpu_id, cpu_model, cpu_words, cpuinfo, this_cpu, vector_isa


@dataclass(frozen=True)
class RunConfig:
    output_path: str
    steps: int = versioned(4)
    loss_scale: float = 1.0
    """Not versioned: two runs that differ only here have the same hash and another result."""


def _checkpoint(folder: Path) -> tensorstore.TensorStore:
    """A zarr3 array in an OCDBT database, as orbax and Levanter write a checkpoint: data files named at random."""
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "ocdbt", "base": f"file://{folder}/"},
        "path": "model/weight",
        "metadata": {"shape": [8, 16], "data_type": "float32", "chunk_grid": {
            "name": "regular", "configuration": {"chunk_shape": [4, 16]}}},
    }  # fmt: skip
    return tensorstore.open(spec, create=True, open=True).result()


def train_like(config: RunConfig) -> None:
    """A train step's outputs: metrics with measured times, a checkpoint, wandb's records, and an eval result that
    names the checkpoint by its full path."""
    out = Path(config.output_path)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(config.steps):
        loss = 4.0 / (step + 1) * (config.loss_scale if step == config.steps - 1 else 1.0)
        speed = 1e6 / (1 + time.perf_counter() % 1)
        lines.append({"step": step, "train/loss": loss, "throughput/duration": time.perf_counter(),
                      "throughput/tokens_per_second": speed, "time": time.time()})  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    checkpoint = out / "checkpoints" / "step-3"
    _checkpoint(checkpoint).write(np.arange(128, dtype=np.float32).reshape(8, 16)).result()
    (checkpoint / "metadata.json").write_text(json.dumps({"step": 3, "timestamp": str(time.time())}))
    run = out / "wandb" / "wandb" / f"offline-run-{time.time_ns()}"
    run.mkdir(parents=True)
    (run / "output.log").write_text(f"started at {time.time()}\n")
    (out / "results.json").write_text(json.dumps({"checkpoint": str(checkpoint), "loss": lines[-1]["train/loss"]}))


def _step(loss_scale: float = 1.0) -> ExecutorStep:
    return ExecutorStep(name="train/like", fn=train_like, config=RunConfig(THIS_OUTPUT_PATH, loss_scale=loss_scale))


def _compare(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli_main(["compare", *args])
    return code, capsys.readouterr().out


def test_two_runs_of_one_result_are_same_and_each_thing_set_aside_is_named(tmp_path: Path, capsys) -> None:
    """Two runs under two prefixes write other bytes in every file but the shards' (times, random checkpoint file
    names, the prefix, wandb's run folder): `compare` says same, and names the database compared by its keys and
    values, the measured keys, the prefix and the run records; `--bytes` says DIFFERENT (exit 1)."""
    a, b = tmp_path / "a", tmp_path / "b"
    Executor(str(a)).run([_step()])
    Executor(str(b)).run([_step()])
    step_a = next((a / "train").iterdir())
    files_a = {p.relative_to(step_a).as_posix() for p in (step_a / "checkpoints").rglob("*") if p.is_file()}
    step_b = b / "train" / step_a.name
    files_b = {p.relative_to(step_b).as_posix() for p in (step_b / "checkpoints").rglob("*") if p.is_file()}
    assert files_a != files_b, "the database's data files should be named at random, as orbax's are"

    code, out = _compare(capsys, str(a), str(b))
    assert code == 0, out
    assert "1 step(s): 1 same, 0 DIFFERENT" in out
    assert "checkpoints/step-3/: an OCDBT database (checkpoint): other file names, the same" in out
    assert "metrics.jsonl: measured times set aside (throughput/duration, throughput/tokens_per_second, time)" in out
    assert "checkpoints/step-3/metadata.json: measured times set aside (timestamp)" in out
    assert "results.json: paths under each side's own prefix read as <prefix>" in out
    assert "wandb/: 2 file(s) that record how the run went" in out, out  # one in each side's own run folder

    code, out = _compare(capsys, str(a), str(b), "--bytes")
    assert code == 1 and "DIFFERENT  train/like-" in out, out
    assert "metrics.jsonl: differs; first differing line 1" in out, out


def test_a_changed_weight_or_loss_is_still_different(tmp_path: Path, capsys) -> None:
    """One weight changed in B's checkpoint (written through tensorstore, as a resumed run would) makes the step
    DIFFERENT and says the database holds other values; a loss changed by 1e-3 relative is DIFFERENT without rtol
    and same with `--rtol 1e-2`, times still set aside."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    Executor(str(a)).run([_step()])
    Executor(str(b)).run([_step()])
    checkpoint = next((b / "train").iterdir()) / "checkpoints" / "step-3"
    array = _checkpoint(checkpoint)
    array[2, 5].write(np.float32(1e-3)).result()
    code, out = _compare(capsys, str(a), str(b))
    assert code == 1, out
    assert "checkpoints/step-3/: an OCDBT database (checkpoint):" in out and "keys, other values" in out, out
    assert "checkpoints/step-3/d/" in out  # the database's files, listed as differing

    Executor(str(c)).run([_step(loss_scale=1.001)])
    code, out = _compare(capsys, str(a), str(c))
    assert code == 1 and "metrics.jsonl: differs; first differing line 4" in out, out
    assert "results.json: differs" in out
    code, out = _compare(capsys, str(a), str(c), "--rtol", "1e-2")
    assert code == 0, out
    assert "metrics.jsonl: equal within rtol 0.01: largest relative difference 0.000999" in out, out
    assert "measured times set aside" in out


ZEN3 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC
flags		: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes

processor	: 1
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 17
model name	: AMD EPYC 9004
flags		: fpu avx512f
"""


def test_the_cpu_record_names_the_generation_and_its_widest_vector_extension(tmp_path: Path) -> None:
    """A virtual machine shows several generations as "AMD EPYC": the record takes the first processor's family,
    model and widest vector extension (what XLA compiles for)."""
    path = tmp_path / "cpuinfo"
    path.write_text(ZEN3)
    fields = cpuinfo(str(path))
    assert (cpu_model(fields), cpu_id(fields), vector_isa(fields)) == ("AMD EPYC", "family 25 model 1", "AVX2")
    assert vector_isa({"flags": "sse4_2 avx avx2 avx512f avx512bw"}) == "AVX-512"
    assert vector_isa({"Features": "fp asimd evtstrm sve"}) == "SVE"
    assert (cpu_id({"Features": "fp asimd"}), vector_isa({})) == (None, None)
    assert cpuinfo(str(tmp_path / "absent")) == {}


def test_a_different_step_says_when_its_two_runs_had_other_cpus(tmp_path: Path, capsys) -> None:
    """Each attempt records the machine that ran it in `.executor_info`; a DIFFERENT step whose sides ran on CPUs of
    another kind or count says so, naming both (trained figures differ in their last bits there), and says nothing
    of machines where they match or where the step is the same."""
    a, b = tmp_path / "a", tmp_path / "b"
    Executor(str(a)).run([_step()])
    Executor(str(b)).run([_step(loss_scale=1.001)])
    info_b = next((b / "train").iterdir()) / ".executor_info"
    assert json.loads(info_b.read_text())["machine"] == this_cpu()
    code, out = _compare(capsys, str(a), str(b))
    assert code == 1 and "DIFFERENT  train/like-" in out and "other CPUs" not in out, out

    info = json.loads(info_b.read_text())
    other = {"cores": 8, "cpu_model": "AMD EPYC", "cpu_id": "family 25 model 17", "vector_isa": "AVX-512"}
    info_b.write_text(json.dumps({**info, "machine": other}))
    code, out = _compare(capsys, str(a), str(b))
    ours = f"{cpu_words(this_cpu())} ({this_cpu()['cores']} cores)"
    assert code == 1 and f"ran on other CPUs: A {ours}, B AMD EPYC, family 25 model 17, AVX-512 (8 cores)" in out, out

    info_b.write_text(json.dumps({key: value for key, value in info.items() if key != "machine"}))
    code, out = _compare(capsys, str(a), str(b))
    assert code == 1 and "other CPUs" not in out, out  # a side recorded before steps named their machine

    c = tmp_path / "c"
    Executor(str(c)).run([_step()])
    info_c = next((c / "train").iterdir()) / ".executor_info"
    info_c.write_text(json.dumps({**json.loads(info_c.read_text()), "machine": other}))
    code, out = _compare(capsys, str(a), str(c))
    assert code == 0 and "other CPUs" not in out, out  # the same result: no word of machines
