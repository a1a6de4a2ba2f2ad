"""Dispatch the steps of one run to a backend in dependency order.

A step is submitted once all of its blocking dependencies in this run have succeeded, with at
most `limit` steps in flight. When one finishes, its dependents may become ready; when one fails,
`on_failure` marks its dependents. A submission that dies of a transient cause outside the step
(a Ray worker or node lost past Ray's own retries) is submitted again after a backoff, up to the
step's `RetryPolicy.max_attempts`; failures inside the step are retried by `run_step` itself.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait

from executor.backends import Backend
from executor.plan import PlannedStep
from executor.retry import DEFAULT_RETRY, is_transient
from executor.step_runner import Outcome, StepResult, StepTask

logger = logging.getLogger(__name__)


def schedule(
    steps: list[PlannedStep],
    backend: Backend,
    make_task: Callable[[PlannedStep], StepTask],
    on_failure: Callable[[PlannedStep, dict[PlannedStep, StepResult]], None],
    limit: int,
) -> dict[PlannedStep, StepResult]:
    """Run `steps` (each with its blocking dependencies among them first); return each one's result."""
    selected = set(steps)
    waiting_on = {planned: {dep for dep in planned.blocking if dep in selected} for planned in steps}
    ready = deque(planned for planned in steps if not waiting_on[planned])
    delayed: list[tuple[float, int, PlannedStep]] = []  # (when, tie-breaker, step): resubmissions
    order = itertools.count()
    submissions: dict[PlannedStep, int] = {}
    results: dict[PlannedStep, StepResult] = {}
    running: dict[Future[StepResult], PlannedStep] = {}
    while ready or running or delayed:
        while delayed and delayed[0][0] <= time.monotonic():
            ready.append(heapq.heappop(delayed)[2])
        while ready and len(running) < limit:
            planned = ready.popleft()
            submissions[planned] = submissions.get(planned, 0) + 1
            running[backend.submit(make_task(planned), planned.step.resources)] = planned
        timeout = max(0.0, delayed[0][0] - time.monotonic()) if delayed else None
        if not running:
            time.sleep(timeout or 0)
            continue
        finished, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
        for future in finished:
            planned = running.pop(future)
            try:
                result = future.result()
            except Exception as error:
                policy = planned.step.retry or DEFAULT_RETRY
                if is_transient(error) and submissions[planned] < policy.max_attempts:
                    wait_s = policy.backoff_s(submissions[planned])
                    logger.warning("%s: lost its worker (%s: %s); submitting again in %.1fs",
                                   planned.label, type(error).__name__, error, wait_s)  # fmt: skip
                    heapq.heappush(delayed, (time.monotonic() + wait_s, next(order), planned))
                    continue
                logger.error("%s: the executor failed around the step: %r", planned.label, error)
                result = StepResult(Outcome.FAILED, f"executor error: {type(error).__name__}: {error}")
            results[planned] = result
            if result.ok:
                for child in planned.dependents:
                    deps = waiting_on.get(child)
                    if deps is not None and planned in deps:
                        deps.discard(planned)
                        if not deps and child not in results:
                            ready.append(child)
            else:
                on_failure(planned, results)
    return results
