"""Multi-host training as a Ray gang, on one machine: two stand-in hosts x 2 fake CPU devices, gloo collectives.

One tiny train step (tests/steps/train/test_train.py's model and data) is trained twice, at once: uninterrupted as one
process over the same 4 global devices (a one-host step asking for them), and once as a 2-host gang whose
coordinator is SIGKILLed once a checkpoint exists. Every loss the gangs log must be the one process's at that step;
a killed member must tear the whole gang down (no process of it left), fail the attempt as transient, and the
executor's retry must start a new gang that resumes from the checkpoint and ends at the uninterrupted loss. One
faulted run serves every claim because compiles are the slow part. (tests/executor/run/test_gang.py holds the gang's
pure parts and its counted-sum gangs, which need no model: a file of its own, so the two run side by side.)
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_gang import STAND_IN
from test_gang import local_ray as local_ray  # the gang tests' local Ray (module scoped)
from test_train import build_data, checkpoint_steps, train_config, train_losses

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, ResourceConfig
from executor.run.gang_member import host_log_file
from executor.store.events import StepStatus, read_events
from executor.store.layout import GANG_FILE
from executor.store.processes import is_running
from steps.model.hf_export import HF_FOLDER, load_hf_export, read_weights
from steps.train.train import TrainConfig, train
from steps.train.train_metrics import read_metrics

STEPS = 15
CHECKPOINT_EVERY = 5
"""Permanent checkpoints: the gang's coordinator is killed after the first."""


# The runs below train a model twice, at once: one process, and two gangs of two (5 compiles on 2 busy cores).
TRAINING_MARKS = (pytest.mark.slow, pytest.mark.training, pytest.mark.ray, pytest.mark.timeout(2400))


def training(test):
    for mark in TRAINING_MARKS:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_data(tmp_path_factory.mktemp("gang-data"))


def gang_config(data: dict[str, str], output_path: str = "unused") -> TrainConfig:
    """The tiny run, without router-bias balancing and at a lower learning rate than test_train's: the
    gang sums its gradients in another order than one process (across gloo), and a sign-driven bias update or
    a top-k choice flipped by a last-bit difference would grow into a loss gap that says nothing of the gang."""
    return train_config(data, output_path, num_train_steps=STEPS, steps_per_eval=STEPS, learning_rate=3e-3,
                        router_bias_balancing=False, checkpoint_every_steps=CHECKPOINT_EVERY,
                        temporary_checkpoint_seconds=600.0)  # fmt: skip


def run_gang(prefix: Path, data: dict[str, str], interfere: Callable[[Path], dict]) -> dict:
    """Train the tiny step as a 2-host gang under `prefix`; `interfere(prefix)` runs beside it in a thread."""
    step = ExecutorStep(name="train/tiny-moe", fn=train, config=gang_config(data, THIS_OUTPUT_PATH), resources=STAND_IN)
    executor = Executor(str(prefix), backend="local")
    seen: dict = {}

    def watch() -> None:
        try:
            seen.update(interfere(prefix))
        except Exception as error:  # re-raised below, in the test's thread
            seen["error"] = error

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    executor.run([step])
    watcher.join(timeout=60)
    if "error" in seen:
        raise seen["error"]
    output_path = Path(executor.output_paths[step])
    return {"output_path": output_path, "records": read_metrics(str(output_path)), **seen}


def faults_after_checkpoints(faults: list[tuple[int, int, int]]) -> Callable[[Path], dict]:
    """An `interfere` that, for each (checkpoint step, member rank, signal) in turn, waits until that checkpoint
    is complete and a gang is running, and sends the signal to that member of it. Returns the signalled gangs'
    members (pid, start ticks), in order."""

    def interfere(prefix: Path) -> dict:
        gangs: list[list[tuple[int, int | None]]] = []
        deadline = time.monotonic() + 1800
        for checkpoint, rank, signum in faults:
            while time.monotonic() < deadline:
                gang_files = list(prefix.glob(f"train/tiny-moe-*/{GANG_FILE}"))
                gang = json.loads(gang_files[0].read_text()) if gang_files else {}
                members = [(member["pid"], member.get("started")) for member in gang.get("members", [])]
                running = gang.get("state") == "running" and members not in gangs
                if running and checkpoint in checkpoint_steps(gang_files[0].parent):
                    os.kill(members[rank][0], signum)
                    gangs.append(members)
                    break
                time.sleep(0.05)
        return {"signalled_gangs": gangs}

    return interfere


def train_one_process(data: dict[str, str], prefix: Path) -> tuple[dict[int, float], Path]:
    """The uninterrupted reference: the same step as one host over the gang's 4 global devices (a Ray task whose
    process gets them: executor/run/cpu_devices.py), so only the process layout differs. Step -> loss, and the step's
    output path (its HF export is the gang's reference)."""
    step = ExecutorStep(name="train/tiny-moe", fn=train, config=gang_config(data, THIS_OUTPUT_PATH),
                        resources=ResourceConfig(cpu_devices_per_host=4))  # fmt: skip
    executor = Executor(str(prefix), backend="ray")
    executor.run([step])
    records = read_metrics(executor.output_paths[step])
    assert [len(record["summary/hardware_topology/devices"]) for record in records
            if "summary/hardware_topology/devices" in record] == [4]  # fmt: skip
    return dict(train_losses(records)), Path(executor.output_paths[step])


@pytest.fixture(scope="module")
def trained(data, local_ray, tmp_path_factory) -> dict:
    """The reference and a gang run whose coordinator is SIGKILLed after the first checkpoint (two gangs, the
    second one finishes), trained at once: compiles take the time, and the local Ray's 2 CPUs hold both (1 for the
    reference, 0.5 per member). A stopped member (a silent heartbeat) is the counted-sum gang's test above: the
    same teardown, without two more trainer processes."""
    faults = [(CHECKPOINT_EVERY, 0, signal.SIGKILL)]
    with ThreadPoolExecutor(max_workers=1) as background:
        reference = background.submit(train_one_process, data, tmp_path_factory.mktemp("one-process"))
        run = run_gang(tmp_path_factory.mktemp("faulted"), data, faults_after_checkpoints(faults))
        one_process, reference_path = reference.result()
    assert len(run["signalled_gangs"]) == 1, "a checkpoint did not appear while a gang was running"
    run["events"] = [event for event in read_events(str(run["output_path"])) if event.attempt]  # not the plan's
    return {"one_process": one_process, "reference_path": reference_path, "faulted": run}


@pytest.fixture(scope="module")
def one_process(trained) -> dict[int, float]:
    return trained["one_process"]


@pytest.fixture(scope="module")
def faulted(trained) -> dict:
    return trained["faulted"]


def check_torn_down_and_retried(run: dict, attempt: int, lost: str) -> None:
    """Attempt `attempt` (1-based) of the faulted run failed as transient because a member `lost` (died or
    hung), was retried, and no process of its gang is left."""
    statuses = [event.status for event in run["events"]]
    assert statuses == [StepStatus.RUNNING, StepStatus.WAITING, StepStatus.RUNNING, StepStatus.SUCCESS]
    message = run["events"][2 * attempt - 1].message or ""
    assert "GangMemberLostError" in message and f") {lost}:" in message, message
    members = run["signalled_gangs"][attempt - 1]
    assert not [pid for pid, started in members if is_running(pid, started)], f"a member of {members} survived"


def final_loss(records: list[dict]) -> float:
    return train_losses(records)[-1][1]


# The gang's export against the one process's: the same weights up to the last bits of a sum over gloo in another
# order (measured: 40 of 47 tensors differ, by 1.6e-7 at most).
EXPORT_RTOL, EXPORT_ATOL = 1e-5, 1e-6


@training
def test_multi_host_gang_trains_to_the_losses_of_one_process(one_process, faulted, trained):
    """Every loss either gang logged (a killed gang's last steps are logged again by the next one,
    resumed from the checkpoint) is the one process's at that step."""
    gang_losses = train_losses(faulted["records"])
    assert {step for step, _ in gang_losses} == set(one_process)
    for step, gang_loss in gang_losses:
        assert abs(gang_loss - one_process[step]) < 1e-5, (step, gang_loss, one_process[step])
    # Metrics are written once, by process 0: a second writer would log every step twice.
    assert [step for step, _ in gang_losses].count(0) == 1
    output_path = faulted["output_path"]
    gang = json.loads((output_path / GANG_FILE).read_text())
    assert gang["state"] == "finished" and [m["state"] for m in gang["members"]] == ["finished", "finished"]
    # Every process reports its training steps to the gang's watch (executor/run/gang_progress.py), process 1 included.
    assert [m["progress_step"] for m in gang["members"]] == [gang_losses[-1][0]] * 2, gang["members"]
    for rank in (0, 1):
        assert f"gang member {rank} of 2" in (output_path / host_log_file(rank)).read_text()
    # The HF export gathers the weights sharded over both processes; process 0 writes them: tensor by tensor the
    # one process's export, and a folder the model loads from.
    gang_weights = read_weights(str(output_path / HF_FOLDER))
    reference_weights = read_weights(str(trained["reference_path"] / HF_FOLDER))
    assert sorted(gang_weights) == sorted(reference_weights) and len(gang_weights) > 10
    for name, reference in reference_weights.items():
        assert gang_weights[name].shape == reference.shape and gang_weights[name].dtype == reference.dtype, name
        np.testing.assert_allclose(gang_weights[name], reference, rtol=EXPORT_RTOL, atol=EXPORT_ATOL, err_msg=name)
    assert load_hf_export(str(output_path / HF_FOLDER)).Vocab.size > 0


@training
def test_gang_member_killed_tears_the_gang_down_and_the_retry_resumes(faulted, one_process):
    check_torn_down_and_retried(faulted, attempt=1, lost="died")
    logs = "".join(path.read_text() for path in (faulted["output_path"] / "logs").glob("*.log"))
    assert "Resuming training from step" in logs  # the second gang restored the first checkpoint
    gang = json.loads((faulted["output_path"] / GANG_FILE).read_text())
    assert gang["state"] == "finished" and not {m["pid"] for m in gang["members"]} & {
        pid for members in faulted["signalled_gangs"] for pid, _ in members
    }
    assert abs(final_loss(faulted["records"]) - one_process[max(one_process)]) < 1e-5
