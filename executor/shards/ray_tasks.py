"""Shards as Ray tasks: one CPU each, and the shard's memory budget reserved when the step states one.

Ray schedules a task only on a node with the resources it asks for, so a step whose shards are sized for
2 GiB runs at most (node memory / 2 GiB) of them per node, however many CPUs the node has: a node does not
start more shards than its memory holds and get OOM-killed half way. A budget no node can hold is logged
once (an autoscaler may still add a node that can), since Ray would otherwise wait for it silently.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from executor.retry import RetryPolicy
from executor.shards.writer import PROGRESS_INTERVAL_S, Shard, ShardFn, run_one_shard

logger = logging.getLogger(__name__)


def execute_ray(
    output_path: str,
    pending: list[Shard],
    fn: ShardFn,
    retry: RetryPolicy,
    generation: int | None,
    max_workers: int | None,
    memory_bytes: int | None,
) -> Iterator[dict[str, Any] | None]:
    """Markers of shards as they commit, and None now and then while none does."""
    import ray

    options: dict[str, Any] = {"num_cpus": 1, "max_retries": retry.max_attempts, "retry_exceptions": False}
    if memory_bytes is not None:
        options["memory"] = memory_bytes
        _warn_if_no_node_holds(output_path, memory_bytes)
    remote = ray.remote(run_one_shard).options(**options)
    queue = list(reversed(pending))
    running: list[Any] = []
    failure: BaseException | None = None
    while queue or running:
        # Recomputed as the autoscaler adds nodes: keep every CPU of the cluster busy, plus a queue.
        limit = max_workers or max(2, int(ray.cluster_resources().get("CPU", 1)) * 2)
        while queue and failure is None and len(running) < limit:
            running.append(remote.remote(output_path, queue.pop(), fn, retry, generation))
        done, running = ray.wait(running, num_returns=1, timeout=PROGRESS_INTERVAL_S)
        if not done:
            yield None
        for ref in done:
            try:
                yield ray.get(ref)
            except ray.exceptions.RayTaskError as error:
                failure = failure or error.as_instanceof_cause()
            except Exception as error:  # a lost worker past its retries
                failure = failure or error
        if failure is not None and not running:
            raise failure


def _warn_if_no_node_holds(output_path: str, memory_bytes: int) -> None:
    import ray

    largest = max((node["Resources"].get("memory", 0) for node in ray.nodes() if node.get("Alive")), default=0)
    if largest < memory_bytes:
        logger.warning(
            "%s: each shard asks Ray for %.1f GiB of memory but the largest live node offers %.1f GiB; the shards "
            "wait until a node that large joins. Lower the step's shard_memory_bytes (more, smaller partitions).",
            output_path, memory_bytes / 2**30, largest / 2**30,
        )  # fmt: skip
