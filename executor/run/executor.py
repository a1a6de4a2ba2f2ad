"""`Executor`: plan a DAG, decide what runs, run it on a backend, and report.

    executor = Executor(prefix="gs://my-bucket/runs")
    executor.run([tokenize_step], force_run=["tokenize"])
    executor.output_paths[tokenize_step]   # gs://my-bucket/runs/tokenize-3f2a9c1b

A step runs when its output is not SUCCESS (or `force_run` names it); what runs is chosen in
selection.py (only what a selected, unfinished step needs); a step waits for its blocking
dependencies; a failure marks its dependents DEP_FAILED while unrelated branches go on; at the
end a `StepFailedError` lists what failed. Many executors may run the same DAG on the same prefix
at once: leases make each step run exactly once (see executor/store/lease.py).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from executor.dag.explain import ExplainReport, explain
from executor.dag.pins import mismatch_message, pins_for_plan, read_pins
from executor.dag.plan import Plan, PlannedStep, build_plan
from executor.dag.records import (
    experiment_file_name,
    experiment_record,
    hash_files,
    info_path,
    output_digest,
    step_info,
)
from executor.dag.spec import ExecutorStep, InputName
from executor.errors import ConfigError, StepFailedError
from executor.retry import DEFAULT_RETRY
from executor.run.backends import check_backend, check_gang_storage, make_backend
from executor.run.force_guard import confirm_or_refuse, discarded_checkpoints
from executor.run.scheduler import schedule
from executor.run.selection import Decision, select
from executor.run.step_runner import record_dep_failed, record_pin_mismatch
from executor.run.step_task import Outcome, StepResult, StepTask
from executor.store import storage
from executor.store.events import StatusEvent, StepStatus, create_initial_status, now_iso, read_many_events
from executor.store.layout import EXPERIMENTS_DIR, LOG_FILE
from executor.store.lease import LeaseSettings, new_worker_id

logger = logging.getLogger(__name__)


class Executor:
    def __init__(
        self,
        prefix: str,
        executor_info_base_path: str | None = None,
        backend: str = "local",
        shared_filesystem: bool = False,
    ):
        """`shared_filesystem=True` vouches that a local-disk `prefix` is mounted on every node of the
        Ray cluster (NFS, a shared volume); without it, `backend="ray"` with `RAY_ADDRESS` set needs an
        object-store prefix."""
        self.prefix = storage.make_absolute(prefix)
        if not storage.is_url(prefix) and self.prefix != prefix:
            logger.info("prefix %r is relative; using the absolute path %s", prefix, self.prefix)
        self.executor_info_base_path = storage.make_absolute(
            executor_info_base_path or storage.join(self.prefix, EXPERIMENTS_DIR)
        )
        check_backend(backend, self.prefix, shared_filesystem)
        self.backend = backend
        self.shared_filesystem = shared_filesystem
        self.lease_settings = LeaseSettings.from_env()
        self.worker_id = new_worker_id()
        self.plan: Plan | None = None
        self.steps: list[ExecutorStep] = []
        self.output_paths: dict[ExecutorStep, str] = {}
        self.versions: dict[ExecutorStep, dict[str, Any]] = {}
        self.version_strs: dict[ExecutorStep, str] = {}
        self.configs: dict[ExecutorStep, Any] = {}
        self.decisions: list[Decision] = []
        self.dry_run = False
        """Whether the last `run` was a dry run (nothing was written)."""
        self.results: dict[PlannedStep, StepResult] = {}
        self.executor_info_path: str | None = None
        self.pins: str | None = None
        """The pin file the last `run` was given."""
        self.pinned: dict[PlannedStep, str] = {}
        """Planned step -> the output digest its pin holds (steps the pin file names at this hash)."""

    # --- planning ---------------------------------------------------------------------------

    def _expose(self, plan: Plan) -> None:
        self.plan = plan
        self.steps = [planned.step for planned in plan.steps]
        for step, planned in plan.by_step.items():
            self.output_paths[step] = planned.output_path
            self.versions[step] = planned.version
            self.version_strs[step] = planned.version_str
            self.configs[step] = planned.config

    def decision_for(self, step: ExecutorStep) -> Decision | None:
        """What the last run decided for `step` (None if it was not selected)."""
        if self.plan is None or step not in self.plan.by_step:
            return None
        planned = self.plan.lookup(step)
        return next((decision for decision in self.decisions if decision.planned is planned), None)

    def explain(self, step: ExecutorStep) -> ExplainReport:
        """Why `step`'s hash is what it is, and how it differs from other stored versions of it."""
        plan = self.plan if self.plan is not None and step in self.plan.by_step else build_plan([step], self.prefix)
        planned = plan.lookup(step)
        return explain(planned.output_path, planned.version, planned.hash, planned.fingerprint)

    # --- running ----------------------------------------------------------------------------

    def run(
        self,
        steps: Sequence[ExecutorStep | InputName],
        *,
        dry_run: bool = False,
        show_all: bool = False,
        run_only: Sequence[str] | None = None,
        force_run: Sequence[str] | None = None,
        force_run_failed: bool = True,
        max_concurrent: int | None = None,
        caller: str | None = None,
        description: str | None = None,
        confirm_discard: Callable[[str], bool] | None = None,
        pins: str | None = None,
    ) -> None:
        """Run every step of `steps` (and what they need) whose output is not SUCCESS yet.

        An `InputName` (`output_path_of(step)`) in `steps` stands for its step. `max_concurrent`
        defaults to max(4, CPUs) on the local backend and to no cap on Ray (the cluster's resources
        decide). Bad selections (a pattern matching no step, `max_concurrent` < 1) are errors raised
        before anything is written. A dry run prints the steps this run looks at (`show_all`: every step
        of the DAG) and writes nothing. A forced step's checkpoints are discarded only if `confirm_discard`
        (given the list) says yes, or if it is None (executor/run/force_guard.py). `pins` names a pin file
        (executor/dag/pins.py): a step pinned under another hash stops the run before anything is written, and a pinned
        step whose bytes are not the pinned ones is FAILED, its output kept."""
        if max_concurrent is not None and max_concurrent < 1:
            raise ConfigError(f"max_concurrent must be at least 1, got {max_concurrent}; nothing was run or written")
        planned_at = now_iso()
        self.dry_run = dry_run
        plan = build_plan(list(steps), self.prefix)
        self._expose(plan)
        self.pins = pins
        self.pinned = pins_for_plan(plan, read_pins(pins), pins) if pins else {}
        self.decisions = select(plan, run_only, force_run or [], force_run_failed)
        caller = caller or "experiment"
        self.executor_info_path = storage.join(self.executor_info_base_path, experiment_file_name(plan, caller))
        discarded = discarded_checkpoints(self.decisions)
        if dry_run:
            self._print_dry_run(plan, show_all)
            for line in discarded:
                print(f"  would discard {line}")
            return
        to_run = [decision for decision in self.decisions if decision.action != "skip"]
        check_gang_storage(
            [(d.planned.label, d.planned.output_path, d.planned.step.resources) for d in to_run], self.shared_filesystem
        )
        confirm_or_refuse(discarded, confirm_discard)
        storage.write_json_atomic(
            self.executor_info_path, experiment_record(plan, caller=caller, description=description)
        )
        for decision in self.decisions:
            if decision.action == "skip":
                logger.info("%s: SUCCESS already, skipping (%s)", decision.planned.label, decision.planned.output_path)
        self._check_pinned_outputs()
        self._prepare(to_run)
        self.results = self._schedule(to_run, planned_at, max_concurrent)
        self._raise_for_failures()

    def _check_pinned_outputs(self) -> None:
        """Re-read every pinned step this run would skip; FAILED (output kept) for one whose files no longer give
        the pinned digest, and the run stops before any step runs."""
        finished = [d.planned for d in self.decisions if d.action == "skip" and d.planned in self.pinned]
        with ThreadPoolExecutor(max_workers=min(storage.IO_THREADS, max(1, len(finished)))) as pool:
            found = list(pool.map(lambda planned: output_digest(hash_files(planned.output_path)), finished))
        messages = {}
        for planned, digest in zip(finished, found, strict=True):
            if digest != self.pinned[planned]:
                message = mismatch_message(planned.label, planned.output_path, digest, self.pinned[planned], self.pins)
                record_pin_mismatch(planned.output_path, self.worker_id, self.lease_settings, message)
                logger.error("%s: FAILED (%s)", planned.label, message)
                messages[planned] = message
        if messages:
            raise StepFailedError(
                f"{len(messages)} pinned step(s) hold other bytes than their pins; nothing was run: "
                + "; ".join(messages.values()),
                [planned.label for planned in messages],
                output_paths={planned.label: planned.output_path for planned in messages},
            )

    def summary(self) -> str:
        """What the last run did: `N step(s) ran here (T taken over from a holder that was gone), E ran by another
        executor, S were already done[, D not run: a dependency failed][; U other ...]`.

        "Ran here": this executor ran the step (to SUCCESS or FAILED); "by another executor": another one held its
        lease and settled it while this one waited. Steps a run did not look at are counted last."""
        outcomes = collections.Counter(result.outcome for result in self.results.values())
        here = outcomes[Outcome.SUCCEEDED] + outcomes[Outcome.FAILED]
        taken_over = sum(result.taken_over for result in self.results.values())
        elsewhere = outcomes[Outcome.DONE_ELSEWHERE] + outcomes[Outcome.FAILED_ELSEWHERE]
        text = f"{here} step(s) ran here"
        if taken_over:
            text += f" ({taken_over} taken over from a holder that was gone)"
        if elsewhere:
            text += f", {elsewhere} ran by another executor"
        text += f", {sum(decision.action == 'skip' for decision in self.decisions)} were already done"
        if outcomes[Outcome.DEP_FAILED]:
            text += f", {outcomes[Outcome.DEP_FAILED]} not run: a dependency failed"
        unneeded = len(self.plan.steps) - len(self.decisions) if self.plan is not None else 0
        if unneeded:
            text += f"; {unneeded} other step(s) of the DAG not needed by this run"
        return text

    def _print_dry_run(self, plan: Plan, show_all: bool) -> None:
        looked_at = {decision.planned for decision in self.decisions}
        others = [planned for planned in plan.steps if planned not in looked_at] if show_all else []
        width = max((len(planned.label) for planned in plan.steps), default=0)
        print(f"Dry run: {len(self.decisions)} step(s) under {self.prefix}; nothing is written.")
        if self.pins:
            print(f"{len(self.pinned)} step(s) pinned by {self.pins} (their bytes are checked): marked [pinned]")
        for decision in self.decisions:
            pinned = self.pinned.get(decision.planned)
            reason = f"{decision.reason} [pinned: digest {pinned[:12]}]" if pinned else decision.reason
            self._print_dry_run_line(decision.action, decision.planned, reason, width)
        if others:
            print(f"Not looked at by this run ({len(others)}): no step that has to run needs them.")
        for planned, events in zip(others, read_many_events([p.output_path for p in others]), strict=True):
            state = f"{events[-1].status} at {events[-1].time}" if events else "never ran"
            self._print_dry_run_line("-", planned, state, width)
        if not show_all and len(self.decisions) < len(plan.steps):
            hidden = len(plan.steps) - len(self.decisions)
            print(f"({hidden} more step(s) of the DAG are not needed by this run; --show_all true lists them)")

    @staticmethod
    def _print_dry_run_line(action: str, planned: PlannedStep, reason: str, width: int) -> None:
        print(f"  {action:<4}  {planned.label:<{width}}  {reason}")
        print(f"        {'':<{width}}  {planned.output_path}")

    def _prepare(self, to_run: list[Decision]) -> None:
        """Write `.executor_info` and a first WAITING event for steps that never ran (exclusive creates).

        Steps with a history are left alone: it is rewritten only by a lease holder.
        """

        def prepare(decision: Decision) -> None:
            planned = decision.planned
            storage.create_exclusive(info_path(planned.output_path), storage.json_bytes(step_info(planned)))
            create_initial_status(planned.output_path, StatusEvent(StepStatus.WAITING, worker=self.worker_id))

        fresh = [decision for decision in to_run if decision.fresh]
        if fresh:
            with ThreadPoolExecutor(max_workers=min(storage.IO_THREADS, len(fresh))) as pool:
                list(pool.map(prepare, fresh))

    def _task(self, decision: Decision, planned_at: str) -> StepTask:
        planned = decision.planned
        return StepTask(
            label=planned.label,
            output_path=planned.output_path,
            fn=planned.step.function,
            config=planned.config,
            info=step_info(planned),
            fingerprint=planned.fingerprint,
            force=decision.force,
            planned_at=planned_at,
            worker_id=self.worker_id,
            lease_settings=self.lease_settings,
            retry=planned.step.retry or DEFAULT_RETRY,
            pinned_digest=self.pinned.get(planned),
            pin_file=self.pins,
        )

    def _schedule(
        self, to_run: list[Decision], planned_at: str, max_concurrent: int | None
    ) -> dict[PlannedStep, StepResult]:
        decision_of = {decision.planned: decision for decision in to_run}
        if not decision_of:
            return {}  # all done: no backend to start (a local Ray takes seconds)
        steps = [(planned.step.resources, planned.fn_name.split(":", 1)[0]) for planned in decision_of]
        backend = make_backend(self.backend, max_concurrent, steps)
        try:
            return schedule(
                list(decision_of),
                backend,
                make_task=lambda planned: self._task(decision_of[planned], planned_at),
                on_failure=lambda planned, results: self._mark_dependents_failed(planned, decision_of, results),
                limit=backend.max_in_flight or len(decision_of),
            )
        finally:
            backend.close()

    def _mark_dependents_failed(
        self, failed: PlannedStep, decision_of: dict[PlannedStep, Decision], results: dict[PlannedStep, StepResult]
    ) -> None:
        stack = list(failed.dependents)
        while stack:
            child = stack.pop()
            if child not in decision_of or child in results:
                continue
            message = f"dependency {failed.label} failed"
            results[child] = StepResult(Outcome.DEP_FAILED, message)
            record_dep_failed(child.output_path, self.worker_id, self.lease_settings, message)
            logger.error("%s: DEP_FAILED (%s) %s", child.label, message, child.output_path)
            stack.extend(child.dependents)

    def _raise_for_failures(self) -> None:
        failed = [p for p, r in self.results.items() if r.outcome in (Outcome.FAILED, Outcome.FAILED_ELSEWHERE)]
        dep_failed = [p for p, r in self.results.items() if r.outcome == Outcome.DEP_FAILED]
        if not failed:
            return
        lines = [
            f"{planned.label}: {self.results[planned].message} (log: {storage.join(planned.output_path, LOG_FILE)})"
            for planned in failed
        ]
        message = f"{len(failed)} step(s) failed: " + "; ".join(lines)
        if dep_failed:
            message += "; not run because a dependency failed (DEP_FAILED): " + ", ".join(p.label for p in dep_failed)
        raise StepFailedError(
            message,
            [p.label for p in failed],
            [p.label for p in dep_failed],
            output_paths={p.label: p.output_path for p in failed},
        )
