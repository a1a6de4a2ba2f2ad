"""Shard-level resume for steps that fan out: each shard commits atomically, with a marker.

    def tokenize_shard(input_file: str, out: ShardWriter) -> dict:
        with out.open(f"tokens/{basename(input_file)}.bin") as handle:   # a temp file, hashed as written
            ...
        return {"rows": n_docs}

    def tokenize(config: TokenizeConfig) -> None:
        shards = [Shard(f"{i:05d}", path) for i, path in enumerate(list_inputs(config.input_path))]
        run_sharded(config.output_path, shards, tokenize_shard)

A shard function writes only through its `ShardWriter` (executor/shards/writer.py): its files move to their
final names only once it returns, and then `<output>/.executor_shards/<shard>.json` records them (size,
sha256), with rows and stats. A shard is done exactly when its marker exists, so a restarted step redoes only the
shards without one. A forced rerun (`--force_run`) must replace the output, not resume it: each
marker records the step's generation (the attempt that started its latest forced run, from the
status history), and markers of an older generation are deleted before any shard runs, so every
shard is redone; a forced run that is interrupted and resumed keeps its own shards. The step's
manifest reuses the markers' checksums instead of reading every file again. While shards run,
`<output>/.executor_progress` holds shards done / total, rows and bytes for `status` and the dashboard.

Shards run in Ray tasks when Ray is initialized (the `ray` backend; executor/shards/ray_tasks.py), else in a
process pool (functions must be importable, i.e. module-level; the pool's workers are kept for the next
call), or in threads for I/O-bound work. A step that sizes its shards for a memory budget passes it
(`memory_bytes`): Ray reserves it per task, and a local pool runs no more shards at once than fit in RAM.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from tqdm import tqdm

from executor.retry import DEFAULT_RETRY, RetryPolicy
from executor.shards.writer import (
    PROGRESS_INTERVAL_S,
    Shard,
    ShardFn,
    marker_path,
    read_shard_markers,
    run_one_shard,
    valid_shard_id,
)
from executor.store import storage
from executor.store.events import forced_generation, now_iso, read_events
from executor.store.layout import PROGRESS_FILE, TEMP_DIR

logger = logging.getLogger(__name__)


@dataclass
class ShardReport:
    total: int
    skipped: int
    """Shards already committed by an earlier attempt, not run again."""
    ran: int
    rows: int
    bytes: int
    markers: dict[str, dict[str, Any]] = field(default_factory=dict)


def _choose_parallelism(parallelism: str) -> str:
    if parallelism != "auto":
        if parallelism not in ("ray", "process", "thread"):
            raise ValueError(f"parallelism must be auto, ray, process or thread, not {parallelism!r}")
        return parallelism
    ray = sys.modules.get("ray")
    return "ray" if ray is not None and ray.is_initialized() else "process"


def run_sharded(
    output_path: str,
    shards: Sequence[Shard],
    fn: ShardFn,
    *,
    parallelism: str = "auto",
    max_workers: int | None = None,
    retry: RetryPolicy | None = None,
    description: str | None = None,
    memory_bytes: int | None = None,
) -> ShardReport:
    """Run `fn` on every shard not yet committed under `output_path`; raise if any shard fails.

    `memory_bytes`: the working set one shard is sized for. Ray reserves it for each shard task (a node
    runs only as many as its memory holds); a local pool runs no more shards at once than fit in RAM."""
    ids = [shard.shard_id for shard in shards]
    bad = [shard_id for shard_id in ids if not valid_shard_id(shard_id)]
    if bad:
        raise ValueError(f"{output_path}: shard ids must be letters, digits, '_', '-', '.'; got {bad[:5]}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{output_path}: shard ids must be unique")
    retry = retry or DEFAULT_RETRY
    storage.delete(storage.join(output_path, TEMP_DIR), recursive=True)  # leftovers of a killed attempt
    generation = forced_generation(read_events(output_path))
    markers = _current_markers(output_path, generation)
    pending = [shard for shard in shards if shard.shard_id not in markers]
    report = ShardReport(total=len(shards), skipped=len(shards) - len(pending), ran=0, rows=0, bytes=0)
    report.markers = {shard_id: markers[shard_id] for shard_id in ids if shard_id in markers}
    report.rows = sum(marker["rows"] for marker in report.markers.values())
    report.bytes = sum(marker["bytes"] for marker in report.markers.values())
    if report.skipped:
        logger.info("%s: %d of %d shards already committed; running %d", output_path,
                    report.skipped, report.total, len(pending))  # fmt: skip
    progress = _Progress(output_path, report, description)
    try:
        chosen = _choose_parallelism(parallelism)
        workers = _memory_cap(max_workers, memory_bytes) if chosen != "ray" else max_workers
        for marker in _execute(output_path, pending, fn, retry, generation, chosen, workers, memory_bytes):
            if marker is None:
                progress.update()
                continue
            report.ran += 1
            report.rows += marker["rows"]
            report.bytes += marker["bytes"]
            report.markers[marker["shard_id"]] = marker
            progress.update()
    finally:
        progress.close()
    return report


def _current_markers(output_path: str, generation: int | None) -> dict[str, dict[str, Any]]:
    """The markers of this output generation; those of an older one (before a forced rerun) are deleted."""
    markers = read_shard_markers(output_path)
    outdated = [shard_id for shard_id, marker in markers.items() if marker.get("generation") != generation]
    if outdated:
        logger.info("%s: force_run: redoing %d shard(s) committed before attempt %s", output_path,
                    len(outdated), generation)  # fmt: skip
        with ThreadPoolExecutor(max_workers=min(storage.IO_THREADS, len(outdated))) as pool:
            list(pool.map(lambda shard_id: storage.delete(marker_path(output_path, shard_id)), outdated))
    return {shard_id: marker for shard_id, marker in markers.items() if shard_id not in outdated}


def _memory_cap(max_workers: int | None, memory_bytes: int | None) -> int | None:
    """`max_workers`, lowered so that that many shards of `memory_bytes` each fit in this machine's RAM."""
    if memory_bytes is None:
        return max_workers
    fitting = max(1, (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // memory_bytes)
    return min(max_workers or os.cpu_count() or 1, fitting)


def _execute(
    output_path: str,
    pending: list[Shard],
    fn: ShardFn,
    retry: RetryPolicy,
    generation: int | None,
    parallelism: str,
    max_workers: int | None,
    memory_bytes: int | None,
) -> Iterator[dict[str, Any] | None]:
    """Markers of shards as they commit, and None now and then while none does."""
    if not pending:
        return
    if parallelism == "ray":
        from executor.shards.ray_tasks import execute_ray

        yield from execute_ray(output_path, pending, fn, retry, generation, max_workers, memory_bytes)
        return
    workers = max(1, min(max_workers or os.cpu_count() or 1, len(pending)))
    if parallelism == "thread":
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shard") as threads:
            yield from _drain(threads, workers, output_path, pending, fn, retry, generation)
        return
    pool = _PROCESS_POOLS.acquire(max_workers or os.cpu_count() or 1)  # workers start as tasks need them
    try:
        yield from _drain(pool, workers, output_path, pending, fn, retry, generation)
    except BrokenProcessPool:
        _PROCESS_POOLS.evict(pool)  # a worker died (killed, out of memory): the next call starts afresh
        raise
    finally:
        _PROCESS_POOLS.release(pool)


def _drain(
    pool: Executor,
    workers: int,
    output_path: str,
    pending: list[Shard],
    fn: ShardFn,
    retry: RetryPolicy,
    generation: int | None,
) -> Iterator[dict[str, Any] | None]:
    """Run `pending` on `pool`, at most two per worker queued at a time; on failure, wait for the running
    ones (they may commit) and start no more."""
    queue = list(reversed(pending))
    running: set[Future[dict[str, Any]]] = set()
    failure: BaseException | None = None
    try:
        while queue or running:
            while queue and failure is None and len(running) < 2 * workers:
                running.add(pool.submit(run_one_shard, output_path, queue.pop(), fn, retry, generation))
            done, running = wait(running, timeout=PROGRESS_INTERVAL_S, return_when=FIRST_COMPLETED)
            if not done:
                yield None  # a tick: let the caller flush progress while shards run long
            for future in done:
                error = future.exception()
                if error is None:
                    yield future.result()
                elif failure is None:
                    failure = error
            if failure is not None and not running:
                raise failure
    finally:
        for future in running:
            future.cancel()
        wait(running)  # an interrupted step returns only once its shards have stopped writing


class _ProcessPools:
    """Spawned shard workers, kept for the next `run_sharded` call of this process.

    Starting a spawned worker re-imports the step's modules (numpy, pyarrow, tokenizers...): seconds per
    worker, paid by every stage of a multi-stage step when each made its own pool. A pool is reused only
    while the environment and import path it was started with are unchanged, since workers read them once;
    a pool no longer reusable is shut down once the steps still using it (other threads) have released it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[tuple[int, int], ProcessPoolExecutor] = {}  # (max workers, context) -> pool
        self._users: dict[ProcessPoolExecutor, int] = {}
        atexit.register(self.shutdown)

    def acquire(self, workers: int) -> ProcessPoolExecutor:
        context = hash((frozenset(os.environ.items()), tuple(sys.path)))
        with self._lock:
            for key, pool in list(self._pools.items()):
                if key[1] != context:
                    self._evict_locked(pool)
            if (workers, context) not in self._pools:
                self._pools[(workers, context)] = ProcessPoolExecutor(workers, mp_context=get_context("spawn"))
            pool = self._pools[(workers, context)]
            self._users[pool] = self._users.get(pool, 0) + 1
            return pool

    def release(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            self._users[pool] -= 1
            if self._users[pool] == 0 and pool not in self._pools.values():
                del self._users[pool]
                pool.shutdown(wait=False, cancel_futures=True)

    def evict(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            self._evict_locked(pool)

    def _evict_locked(self, pool: ProcessPoolExecutor) -> None:
        self._pools = {key: cached for key, cached in self._pools.items() if cached is not pool}
        if not self._users.get(pool):
            self._users.pop(pool, None)
            pool.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        with self._lock:
            pools, self._pools, self._users = set(self._pools.values()) | set(self._users), {}, {}
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)


_PROCESS_POOLS = _ProcessPools()


class _Progress:
    """A progress bar for people and `.executor_progress` for status views, throttled."""

    def __init__(self, output_path: str, report: ShardReport, description: str | None):
        self.path = storage.join(output_path, PROGRESS_FILE)
        self.report = report
        self.bar = tqdm(total=report.total, initial=report.skipped, desc=description or "shards", unit="shard",
                        disable=None, leave=False)  # fmt: skip
        self._written_at = 0.0
        self._written_done = -1
        self.update(force=True)

    def update(self, force: bool = False) -> None:
        """Write the progress file if it changed and the last write is old enough (or `force`)."""
        done = self.report.skipped + self.report.ran
        self.bar.n = done
        self.bar.refresh()
        now = time.monotonic()
        if force or (done != self._written_done and now - self._written_at >= PROGRESS_INTERVAL_S):
            self._written_at, self._written_done = now, done
            storage.write_json_atomic(self.path, {
                "shards_total": self.report.total, "shards_done": done, "shards_skipped": self.report.skipped,
                "rows": self.report.rows, "bytes": self.report.bytes, "updated": now_iso(),
            })  # fmt: skip

    def close(self) -> None:
        self.update(force=True)
        self.bar.close()
