"""What a `--watch` cycle costs: bytes written as a run grows, and what an idle cycle reads.

Bytes are counted in the destination folder itself (every file created or replaced in the cycle, by inode,
time and size), not by the publisher's own counter; reads through a memory:// store that records every open
and listing. The prefix is tests/support/publish_dag.py's real DAG.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
from conftest import wait_until
from fsspec.implementations.memory import MemoryFileSystem
from publish_dag import STALL_GATES, START_TIME, StalledRunConfig, build_publish_prefix, metrics_line, stalled_run
from test_publish import published_lines

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, storage, versioned
from executor.store.events import read_status
from executor.store.layout import METRICS_FILE
from executor.store.metrics_log import MetricsLog
from executor.watch.site.files import PublishError
from executor.watch.site.publish import SitePublisher

FIXED_BYTES = 4096
"""What a cycle may write besides the new lines and the run's views: the index, the file listing, manifests."""
VIEWS = ("run.json", "metrics.json")
"""A grown run's two views, rewritten whole each cycle: their size is bounded by their buckets (see
test_a_runs_views_stay_bounded_however_long_it_runs), not by the run's length."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    prefix = tmp_path_factory.mktemp("publish-cost") / "prefix"
    return {"prefix": prefix, "paths": build_publish_prefix(prefix)}


def snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    files = (Path(root, name) for root, _, names in os.walk(folder) for name in names)
    return {str(path): (stat.st_ino, stat.st_mtime_ns, stat.st_size) for path in files if (stat := path.stat())}


def bytes_written(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> int:
    """Bytes of the files the cycle created or replaced (an atomic write replaces the inode), but the views."""
    changed = (entry[2] for path, entry in after.items() if before.get(path) != entry and not path.endswith(VIEWS))
    return sum(changed)


def append_lines(metrics: Path, steps: range) -> int:
    """Append the healthy run's lines for `steps`; returns their bytes."""
    text = "".join(json.dumps(metrics_line(step)) + "\n" for step in steps)
    with metrics.open("a") as handle:
        handle.write(text)
    return len(text.encode())


def measured_cycle(publisher: SitePublisher, site: Path) -> int:
    before = snapshot(site)
    publisher.cycle()
    return bytes_written(before, snapshot(site))


def test_a_cycle_writes_the_new_lines_plus_a_fixed_cost(built, tmp_path: Path) -> None:
    prefix, site = tmp_path / "prefix", tmp_path / "site"
    shutil.copytree(built["prefix"], prefix)
    metrics = prefix / built["paths"]["healthy"] / METRICS_FILE
    # One clock reading for every cycle: data/site.json's "published at" (to the second) and the site manifest
    # naming it are rewritten whenever the second turns, ~250 bytes a cycle takes or not by how loaded the machine is.
    now = time.time()
    publisher = SitePublisher(str(prefix), str(site), clock=lambda: now)
    publisher.cycle()
    cost, step = {}, 80
    for count in (1, 10, 100):
        line_bytes = append_lines(metrics, range(step, step + count))
        step += count
        cost[count] = measured_cycle(publisher, site)
        assert cost[count] <= FIXED_BYTES + 1.1 * line_bytes, (count, cost[count], line_bytes)
    append_lines(metrics, range(step, 1910))  # the run grows 10x (191 -> 1910 steps)
    publisher.cycle()
    append_lines(metrics, range(1910, 1920))
    grown = measured_cycle(publisher, site)
    assert grown <= cost[10] + 256, (grown, cost)  # the same per new line on a run 10x as long
    assert [line["step"] for line in published_lines(site, built["paths"]["healthy"])] == list(range(1920))


def test_a_running_step_costs_its_new_lines_plus_a_fixed_cost(tmp_path: Path, fast_leases) -> None:  # type: ignore[no-untyped-def]
    """The same while the step runs (lease live, heartbeats going): its experiment's table is not rewritten
    for the clock's sake either (the page counts a running step's time itself)."""
    gate = "running-cost"
    STALL_GATES[gate] = threading.Event()
    config = StalledRunConfig(THIS_OUTPUT_PATH, versioned(gate))
    step = ExecutorStep(name="train/running", fn=stalled_run, config=config)
    executor = Executor(str(tmp_path / "prefix"))
    runner = threading.Thread(target=executor.run, args=([step],), kwargs={"caller": "experiments/running.py"})
    runner.start()
    try:
        wait_until(lambda: step in executor.output_paths, "the step to be planned")
        metrics = Path(executor.output_paths[step], METRICS_FILE)
        wait_until(lambda: metrics.exists() and read_status(str(metrics.parent)) == "RUNNING", "the step to run")
        clock = START_TIME + 2.0 * 20  # just after its last line: no stall
        publisher = SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site"), clock=lambda: clock)
        publisher.cycle()
        for count, first in ((1, 20), (30, 21)):
            line_bytes = append_lines(metrics, range(first, first + count))
            before = snapshot(tmp_path / "site")
            publisher.cycle()
            after = snapshot(tmp_path / "site")
            assert bytes_written(before, after) <= FIXED_BYTES + 1.1 * line_bytes, (count, line_bytes)
            assert not [path for path in after if path.endswith("steps.json") and before.get(path) != after[path]]
    finally:
        STALL_GATES[gate].set()
        runner.join(timeout=120)


def test_over_many_cycles_each_line_is_written_about_twice(built, tmp_path: Path) -> None:
    """Chunks are folded into sealed segments (each line written twice in all), the open chunks stay few,
    and a restarted watcher goes on from the published index without rewriting what is out."""
    prefix, site = tmp_path / "prefix", tmp_path / "site"
    shutil.copytree(built["prefix"], prefix)
    relative = built["paths"]["healthy"]
    metrics = prefix / relative / METRICS_FILE
    publisher = SitePublisher(str(prefix), str(site), segment_bytes=8192, max_chunks=8)
    publisher.cycle()
    total, new_bytes, step, cycles = 0, 0, 80, 0
    for count in [3, 7, 1, 12, 5] * 8:
        new_bytes += append_lines(metrics, range(step, step + count))
        step += count
        cycles += 1
        total += measured_cycle(publisher, site)
        if cycles == 20:
            publisher = SitePublisher(str(prefix), str(site), segment_bytes=8192, max_chunks=8)  # a restart
    assert total <= cycles * FIXED_BYTES + 2.2 * new_bytes, (total, new_bytes)
    index = json.loads((site / "data" / "step" / relative / "metrics" / "index.json").read_text())
    assert index["segments"] >= 4 and index["next_chunk"] - index["first_chunk"] < 8
    assert [line["step"] for line in published_lines(site, relative)] == list(range(step))
    on_site = sorted(path.name for path in (site / "data" / "step" / relative / "metrics").glob("c*.jsonl"))
    assert len(on_site) == index["next_chunk"] - index["first_chunk"]  # folded chunks are deleted


def test_a_rerun_that_rewrites_the_metrics_is_published_anew(built, tmp_path: Path) -> None:
    prefix, site = tmp_path / "prefix", tmp_path / "site"
    shutil.copytree(built["prefix"], prefix)
    relative = built["paths"]["healthy"]
    metrics = prefix / relative / METRICS_FILE
    publisher = SitePublisher(str(prefix), str(site), segment_bytes=4096)
    publisher.cycle()
    metrics.write_text("".join(json.dumps(metrics_line(step)) + "\n" for step in range(5)))  # a --force_run
    publisher.cycle()
    index = json.loads((site / "data" / "step" / relative / "metrics" / "index.json").read_text())
    assert index["epoch"] == 1
    assert [line["step"] for line in published_lines(site, relative)] == list(range(5))


class CountingMemoryFileSystem(MemoryFileSystem):
    """fsspec's memory store, recording every file opened and every folder listed (`countmem://`)."""

    protocol = "countmem"
    opened: ClassVar[list[str]] = []
    listed: ClassVar[list[str]] = []

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        CountingMemoryFileSystem.opened.append(path)
        return super()._open(path, mode, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> Any:
        CountingMemoryFileSystem.opened.append(path)
        return super().cat_file(path, start, end, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        CountingMemoryFileSystem.listed.append(path)
        return super().ls(path, detail=detail, **kwargs)


def counted_cycle(publisher: SitePublisher) -> tuple[list[str], list[str]]:
    """(files opened, folders listed) in the prefix during one cycle."""
    CountingMemoryFileSystem.opened.clear()
    CountingMemoryFileSystem.listed.clear()
    publisher.cycle()
    return list(CountingMemoryFileSystem.opened), list(CountingMemoryFileSystem.listed)


def test_an_idle_cycle_lists_each_step_once_and_opens_no_file(built, tmp_path: Path) -> None:
    fsspec.register_implementation("countmem", CountingMemoryFileSystem, clobber=True)
    prefix = f"countmem://idle-{uuid.uuid4().hex[:8]}/prefix"
    fs, root = storage.filesystem(prefix)
    for path in Path(built["prefix"]).rglob("*"):
        if path.is_file():
            fs.pipe_file(f"{root}/{path.relative_to(built['prefix']).as_posix()}", path.read_bytes())
    publisher = SitePublisher(prefix, str(tmp_path / "site"))
    opened, _ = counted_cycle(publisher)
    assert any(path.endswith(METRICS_FILE) for path in opened)  # the first cycle reads everything
    opened, listed = counted_cycle(publisher)
    steps = len(built["paths"])
    assert opened == [] and len(listed) <= steps + 1, (opened, listed)  # the steps and the experiments folder
    healthy, faulty = (f"{root}/{built['paths'][key]}/{METRICS_FILE}" for key in ("healthy", "faulty"))
    fs.pipe_file(healthy, fs.cat_file(healthy) + (json.dumps(metrics_line(80)) + "\n").encode())
    opened, _ = counted_cycle(publisher)
    assert healthy in opened  # the changed run is read, and its neighbour data/corpus; the other run is not
    assert not [path for path in opened if path.startswith(faulty.rsplit("/", 1)[0])], opened


@pytest.mark.gcs
def test_a_run_on_gcs_growing_by_segments_costs_its_new_lines(built, gcs_emulator: str, tmp_path: Path) -> None:
    """A prefix on an object store: the run's new lines arrive as metrics.jsonl.d segments (no append there),
    which the step's mark lists; an idle cycle writes nothing, a grown one the new lines and a fixed cost."""
    prefix = f"{gcs_emulator}/cost-{uuid.uuid4().hex[:8]}"
    fs, root = storage.filesystem(prefix)
    fs.put(str(built["prefix"]), root, recursive=True)
    storage.forget_listings(prefix, everything=True)
    site = tmp_path / "site"
    publisher = SitePublisher(prefix, str(site))
    publisher.cycle()  # it writes the faulty run's alerts.jsonl, and takes that run's mark again
    assert measured_cycle(publisher, site) == 0
    log = MetricsLog(storage.join(prefix, built["paths"]["healthy"], METRICS_FILE), flush_seconds=0)
    lines = [json.dumps(metrics_line(step)) for step in range(80, 90)]
    for line in lines:
        log.write(line)
    log.close()
    cost = measured_cycle(publisher, site)
    assert cost <= FIXED_BYTES + 1.1 * sum(len(line) + 1 for line in lines), cost
    assert [line["step"] for line in published_lines(site, built["paths"]["healthy"])] == list(range(90))


@pytest.mark.slow
def test_a_runs_views_stay_bounded_however_long_it_runs(built, tmp_path: Path) -> None:
    """run.json and metrics.json keep each bucket's extremes: a run 10x as long (past the buckets) draws
    no more, so the views a cycle rewrites cost the same on the hero's 390k steps as on 5k."""
    prefix, site = tmp_path / "prefix", tmp_path / "site"
    shutil.copytree(built["prefix"], prefix)
    relative = built["paths"]["healthy"]
    metrics = prefix / relative / METRICS_FILE
    publisher = SitePublisher(str(prefix), str(site))
    sizes = []
    for last in (5_000, 50_000):
        append_lines(metrics, range(80 if not sizes else 5_000, last))
        publisher.cycle()
        sizes.append(sum((site / "data" / "step" / relative / name).stat().st_size for name in VIEWS))
    assert sizes[1] <= 1.2 * sizes[0], sizes  # steps of 5 digits, not 4
    assert sizes[1] < 2_000_000, sizes


def test_a_restarted_watcher_rewrites_nothing_and_a_broken_manifest_is_named(built, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "site-manifest.json").write_text(json.dumps({"index.html": "0" * 64}))  # the older, flat layout
    assert SitePublisher(str(built["prefix"]), str(site)).cycle().files_written > 40  # rewritten once
    assert SitePublisher(str(built["prefix"]), str(site)).cycle().files_written == 0  # the folders' manifests
    (site / "data" / "site-manifest.json").write_text("{cut off")
    with pytest.raises(PublishError, match=r"data/site-manifest\.json failed"):
        SitePublisher(str(built["prefix"]), str(site))
