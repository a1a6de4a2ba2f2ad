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

from executor.dag.plan import PlannedStep
from executor.retry import DEFAULT_RETRY, is_transient
from executor.run.backends import Backend
from executor.run.interrupts import STOP_GRACE_S
from executor.run.step_task import Outcome, StepResult, StepTask

logger = logging.getLogger(__name__)

INTERRUPT_GRACE_S = 30.0
"""After Ctrl-C, how long to wait for interrupted steps to record FAILED and free their leases."""
AFTER_ABANDON_S = 1.0
"""...and how long the steps not abandoned (Ray tasks recording FAILED) then get before the run ends."""

WAKE_S = 0.5
"""The loop never blocks longer than this. The kernel may deliver Ctrl-C's SIGINT to any thread (a step's, a
lease renewer's); Python only runs the handler, and raises KeyboardInterrupt, once the main thread runs again.
A main thread blocked without a timeout until a step ends saw the Ctrl-C only then (never, for a step waiting
on something the user meant to stop)."""


def schedule(
    steps: list[PlannedStep],
    backend: Backend,
    make_task: Callable[[PlannedStep], StepTask],
    on_failure: Callable[[PlannedStep, dict[PlannedStep, StepResult]], None],
    limit: int,
) -> dict[PlannedStep, StepResult]:
    """Run `steps` (each with its blocking dependencies among them first); return each one's result."""
    run = _Run(steps, backend, make_task, on_failure)
    try:
        while run.ready or run.running or run.delayed:
            run.submit_ready(limit)
            timeout = min(WAKE_S, max(0.0, run.delayed[0][0] - time.monotonic())) if run.delayed else WAKE_S
            if not run.running:
                time.sleep(timeout)
                continue
            finished, _ = wait(run.running, timeout=timeout, return_when=FIRST_COMPLETED)
            for future in finished:
                run.finish(future)
    except KeyboardInterrupt:
        logger.warning("interrupted: stopping %d running step(s); they are recorded FAILED", len(run.running))
        backend.interrupt()
        _, pending = wait(run.running, timeout=STOP_GRACE_S)
        abandoned = backend.abandon_stuck() if pending else 0
        if abandoned:  # their futures never complete: their threads stay blocked until the process exits
            logger.warning("interrupted: %d step(s) did not stop within %.0f s (blocked in a native call): recorded "
                           "FAILED, leases freed, their threads left behind or their Ray workers killed", abandoned,
                           STOP_GRACE_S)  # fmt: skip
        wait(pending, timeout=AFTER_ABANDON_S if abandoned else INTERRUPT_GRACE_S)
        raise
    return run.results


class _Run:
    """The state of one scheduling loop."""

    def __init__(
        self,
        steps: list[PlannedStep],
        backend: Backend,
        make_task: Callable[[PlannedStep], StepTask],
        on_failure: Callable[[PlannedStep, dict[PlannedStep, StepResult]], None],
    ):
        self.backend, self.make_task, self.on_failure = backend, make_task, on_failure
        selected = set(steps)
        self.waiting_on = {planned: {dep for dep in planned.blocking if dep in selected} for planned in steps}
        self.ready = deque(planned for planned in steps if not self.waiting_on[planned])
        self.delayed: list[tuple[float, int, PlannedStep]] = []  # (when, tie-breaker, step): resubmissions
        self.order = itertools.count()
        self.submissions: dict[PlannedStep, int] = {}
        self.results: dict[PlannedStep, StepResult] = {}
        self.running: dict[Future[StepResult], PlannedStep] = {}

    def submit_ready(self, limit: int) -> None:
        while self.delayed and self.delayed[0][0] <= time.monotonic():
            self.ready.append(heapq.heappop(self.delayed)[2])
        while self.ready and len(self.running) < limit:
            planned = self.ready.popleft()
            self.submissions[planned] = self.submissions.get(planned, 0) + 1
            self.running[self.backend.submit(self.make_task(planned), planned.step.resources)] = planned

    def finish(self, future: Future[StepResult]) -> None:
        planned = self.running.pop(future)
        try:
            result = future.result()
        except Exception as error:
            policy = planned.step.retry or DEFAULT_RETRY
            if is_transient(error) and self.submissions[planned] < policy.max_attempts:
                wait_s = policy.backoff_s(self.submissions[planned])
                logger.warning("%s: lost its worker (%s: %s); submitting again in %.1fs",
                               planned.label, type(error).__name__, error, wait_s)  # fmt: skip
                heapq.heappush(self.delayed, (time.monotonic() + wait_s, next(self.order), planned))
                return
            logger.error("%s: the executor failed around the step: %r", planned.label, error)
            result = StepResult(Outcome.FAILED, f"executor error: {type(error).__name__}: {error}")
        self.results[planned] = result
        if not result.ok:
            self.on_failure(planned, self.results)
            return
        for child in planned.dependents:
            deps = self.waiting_on.get(child)
            if deps is not None and planned in deps:
                deps.discard(planned)
                if not deps and child not in self.results:
                    self.ready.append(child)
