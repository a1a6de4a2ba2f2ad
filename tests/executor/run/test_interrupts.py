"""Ctrl-C: running steps are recorded FAILED, their leases freed, and the next run starts at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import make_step, wait_until
from gate_runner import gate_step
from paths import SUPPORT

from executor import Executor, ExecutorStep, read_status
from executor.run import step_runner
from executor.store.events import read_events
from executor.store.lease import Lease, LeaseSettings

RUNNER = str(SUPPORT / "gate_runner.py")


def ignore_sigint() -> None:
    """What a shell does to a background job (`make test &`): the child inherits an ignored SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("backend", "parent_ignores_sigint"),
    [("local", False), ("local", True), pytest.param("ray", False, marks=[pytest.mark.ray, pytest.mark.slow])],
)
def test_ctrl_c_records_failed_and_frees_the_lease(tmp_path, backend, parent_ignores_sigint):
    prefix, gate = tmp_path / "out", tmp_path / "gate"
    step = gate_step(str(gate), str(prefix) + "-records")
    planner = Executor(str(prefix))
    planner.run([step], dry_run=True)
    output = planner.output_paths[step]
    log = open(tmp_path / "run.log", "wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, RUNNER, str(prefix), str(gate), backend], stdout=log,
                               stderr=subprocess.STDOUT, env=env,
                               preexec_fn=ignore_sigint if parent_ignores_sigint else None)  # fmt: skip
    try:
        wait_until(lambda: read_status(output) == "RUNNING", "the step to run")
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=120) != 0
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            pytest.fail("the run did not end after Ctrl-C:\n" + (tmp_path / "run.log").read_text())
    finally:
        process.kill()
        log.close()
    history = read_events(output)
    assert history[-1].status == "FAILED" and history[-1].message == "interrupted by the user", history
    current = Lease(output, "observer", LeaseSettings()).current()
    assert current is not None and current["released"] is True
    assert "KeyboardInterrupt" in (tmp_path / "run.log").read_text()
    gate.write_text("")
    rerun = Executor(str(prefix))
    rerun.run([step])  # default lease timings: it would wait 90 s for a lease that was not freed
    assert read_status(output) == "SUCCESS"
    assert [event.status for event in read_events(output)][-2:] == ["RUNNING", "SUCCESS"]


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])])
def test_ctrl_c_ends_a_run_whose_step_is_blocked_in_a_native_call(tmp_path, backend):
    """The step waits inside the kernel (opening a named pipe no one writes), where the exception that stops a step
    never arrives: the run still ends soon after Ctrl-C (the step abandoned: recorded FAILED, its heartbeat stopped,
    its lease freed; on the local backend its thread left to die with the process, on Ray its worker process
    killed), with no thread's error at exit, and the next run takes the step at once. The time from Ctrl-C to exit
    is printed (a few seconds here; the pipe would block forever), and bounded only far above it."""
    from gate_runner import fifo_step

    prefix, fifo = tmp_path / "out", tmp_path / "pipe"
    os.mkfifo(fifo)
    step = fifo_step(str(fifo))
    planner = Executor(str(prefix))
    planner.run([step], dry_run=True)
    output = planner.output_paths[step]
    log = open(tmp_path / "run.log", "wb")
    mode = "fifo" if backend == "local" else "ray-fifo"
    process = subprocess.Popen([sys.executable, RUNNER, str(prefix), str(fifo), mode], stdout=log,
                               stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        wait_until(lambda: read_status(output) == "RUNNING", "the step to run")
        time.sleep(1.0)  # inside open() by now
        interrupted_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=60) != 0
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            pytest.fail("the run did not end after Ctrl-C:\n" + (tmp_path / "run.log").read_text())
        print(f"Ctrl-C to exit: {time.monotonic() - interrupted_at:.2f} s")
    finally:
        process.kill()
        log.close()
    text = (tmp_path / "run.log").read_text()
    history = read_events(output)
    abandoned = step_runner.ABANDONED if backend == "local" else step_runner.WORKER_KILLED
    assert history[-1].status == "FAILED" and history[-1].message == abandoned, history
    assert history[-1].message.startswith("interrupted by the user")
    current = Lease(output, "observer", LeaseSettings()).current()
    assert current is not None and current["released"] is True
    assert "KeyboardInterrupt" in text and "did not stop within" in text
    assert "Exception in thread" not in text and "Exception ignored" not in text, text

    def write_the_pipe() -> None:
        with open(fifo, "wb") as handle:  # blocks until the rerun's step opens it for reading
            handle.write(b"go")

    writer = threading.Thread(target=write_the_pipe, daemon=True)
    writer.start()
    Executor(str(prefix)).run([step])  # default lease timings: it would wait 90 s for a lease that was not freed
    assert read_status(output) == "SUCCESS" and Path(output, "read.bin").read_bytes() == b"go"


def run_interrupted(tmp_path: Path) -> tuple[Executor, ExecutorStep, str]:
    """A one-step run on the local backend that a KeyboardInterrupt ends (patched in by the test)."""
    step = make_step("interrupted")
    executor = Executor(str(tmp_path / "out"))
    with pytest.raises(KeyboardInterrupt):
        executor.run([step])
    return executor, step, executor.output_paths[step]


def test_ctrl_c_after_running_is_written_but_before_the_step_function_still_records_failed(tmp_path, monkeypatch):
    """Ctrl-C (on a Ray worker: Ray's cancel) can land after RUNNING is written and before the step function
    starts, while the step log and the heartbeat start: seen on a busy machine, it left the step RUNNING."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(step_runner, "Heartbeat", interrupted)
    executor, step, output = run_interrupted(tmp_path)
    statuses = [(event.status, event.message) for event in read_events(output)]
    assert statuses[-2:] == [("RUNNING", None), ("FAILED", "interrupted by the user")], statuses
    current = Lease(output, "observer", LeaseSettings()).current()
    assert current is not None and current["released"] is True
    monkeypatch.undo()
    executor.run([step])  # the lease was freed: the rerun starts at once
    assert read_status(output) == "SUCCESS"


def test_ctrl_c_after_success_is_written_leaves_the_step_success(tmp_path, monkeypatch):
    """The other side of the window above: an interrupt once SUCCESS is recorded adds nothing after it."""
    record = step_runner._append_holding

    def then_interrupted(output_path, lease, beat, event):
        record(output_path, lease, beat, event)
        if event.status == "SUCCESS":
            raise KeyboardInterrupt

    monkeypatch.setattr(step_runner, "_append_holding", then_interrupted)
    _, _, output = run_interrupted(tmp_path)
    assert [event.status for event in read_events(output)][-2:] == ["RUNNING", "SUCCESS"]
    assert read_status(output) == "SUCCESS"
