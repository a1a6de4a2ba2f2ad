"""Python's garbage collector while a step runs (executor/run/collector.py): raised inside, the process's own
thresholds back when the last thread leaves, never lowered, never turned back on. Each check runs in a fresh
interpreter, which starts at Python's defaults (the test session itself collects rarely: tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from paths import REPO

from executor.run.collector import YOUNG_THRESHOLD


def thresholds_seen(script: str) -> dict[str, list[int]]:
    """Run `script` (which calls `seen(name)` at the points to check) in a fresh interpreter."""
    prelude = textwrap.dedent("""
        import gc, json, threading
        from executor.run.collector import collect_rarely, rare_collections
        SEEN = {}
        def seen(name):
            SEEN[name] = list(gc.get_threshold())
    """)
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script) + "\nprint(json.dumps(SEEN))"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


DEFAULT = [700, 10, 10]
RAISED = [YOUNG_THRESHOLD, 10, 10]


def test_raised_inside_nested_and_the_processes_own_back_after() -> None:
    seen = thresholds_seen("""
        seen("before")
        with rare_collections():
            seen("inside")
            with rare_collections():
                seen("nested")
            seen("after nested")
        seen("after")
    """)
    assert seen == {"before": DEFAULT, "inside": RAISED, "nested": RAISED, "after nested": RAISED, "after": DEFAULT}


def test_steps_on_several_threads_give_the_thresholds_back_when_the_last_leaves() -> None:
    seen = thresholds_seen("""
        first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
        def first():
            with rare_collections():
                first_in.set()
                second_in.wait()
            first_out.set()
        def second():
            first_in.wait()
            with rare_collections():
                second_in.set()
                first_out.wait()
                seen("second inside, first left")
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seen("both left")
    """)
    assert seen == {"second inside, first left": RAISED, "both left": DEFAULT}


def test_a_process_that_collects_more_rarely_or_never_keeps_its_own() -> None:
    seen = thresholds_seen("""
        gc.set_threshold(50_000, 20, 20)
        with rare_collections():
            seen("higher inside")
        gc.set_threshold(0)
        with rare_collections():
            seen("off inside")
        seen("off after")
    """)
    assert seen == {"higher inside": [50_000, 20, 20], "off inside": [0, 20, 20], "off after": [0, 20, 20]}


def test_collect_rarely_lasts_for_the_rest_of_the_process() -> None:
    seen = thresholds_seen("""
        collect_rarely()
        seen("set")
        gc.set_threshold(700)
        with rare_collections():
            collect_rarely()
        seen("set inside a step")
    """)
    assert seen == {"set": RAISED, "set inside a step": RAISED}
