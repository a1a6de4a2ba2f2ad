"""A process named by its pid and start time (executor/store/processes.py): a later process given the same pid is
not it, so a lease holder's reused pid never keeps a dead holder alive, and a gang's teardown never signals a
process that only inherited a member's pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from executor.run.gang import wait_gone
from executor.store.lease import holder_is_gone, this_host
from executor.store.processes import is_running, start_ticks


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_process_runs_until_it_exits_and_its_zombie_does_not_count() -> None:
    child = sleeper()
    started = start_ticks(child.pid)
    assert isinstance(started, int) and is_running(child.pid, started) and is_running(child.pid)
    child.kill()
    deadline = time.monotonic() + 30
    while is_running(child.pid) and time.monotonic() < deadline:  # dead, not yet reaped: a zombie
        time.sleep(0.01)
    assert not is_running(child.pid, started) and start_ticks(child.pid) is not None  # the zombie's entry is there
    child.wait()
    assert not is_running(child.pid, started) and start_ticks(child.pid) is None


def test_the_same_pid_with_another_start_time_is_another_process() -> None:
    own = start_ticks(os.getpid())
    assert own is not None and is_running(os.getpid(), own)
    assert not is_running(os.getpid(), own - 1)  # what a pid reused since the record was written looks like


def test_a_lease_holder_whose_pid_now_names_another_process_is_gone() -> None:
    record = {"host": this_host(), "pid": os.getpid(), "started": start_ticks(os.getpid())}
    assert not holder_is_gone(record)
    assert holder_is_gone({**record, "started": record["started"] - 1})
    assert not holder_is_gone({"host": this_host(), "pid": os.getpid()})  # a record from before: the pid alone
    assert not holder_is_gone({**record, "host": "elsewhere", "started": 0})  # another machine's: not ours to judge


def test_teardown_kills_a_member_that_outlives_it_and_never_a_process_that_took_a_members_pid() -> None:
    member, bystander = sleeper(), sleeper()
    try:
        member_started, bystander_started = start_ticks(member.pid), start_ticks(bystander.pid)
        assert member_started is not None and bystander_started is not None
        # The bystander holds a pid the gang's record gave a member that started at another time.
        wait_gone("gang test", [(member.pid, member_started), (bystander.pid, bystander_started + 1)], timeout_s=0.5)
        assert member.wait(timeout=30) == -9  # SIGKILLed once the timeout passed, and gone when wait_gone returned
        assert bystander.poll() is None and is_running(bystander.pid, bystander_started)
    finally:
        for process in (member, bystander):
            process.kill()
            process.wait()
