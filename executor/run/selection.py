"""Which planned steps one run looks at, and what it does with each: run, skip or wait.

A run starts from its roots: the steps `run_only` matches (else the steps passed to `run()`) and
those `force_run` matches. A root that has to run needs its blocking dependencies, which are looked
at in turn; a step that already succeeded needs nothing. So a dependency whose output was deleted is
rebuilt only when a step that still has to run needs it, as in Marin:

    a -> b -> c, all SUCCESS, then a's output deleted
    run_only=["b"]  ->  b: skip; a is not looked at (nothing unfinished needs it)
    b's output deleted too, run_only=["b"]  ->  a: run, b: run

Patterns are regexes matched against the whole step name (executor/dag/patterns.py). A pattern that
matches no step is an error naming the closest step names, raised before anything is written: a
typo must not silently run nothing (or everything). All status histories are read in one batch.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from executor.dag.patterns import compile_pattern
from executor.dag.plan import Plan, PlannedStep
from executor.errors import ConfigError, StepFailedError
from executor.store.events import StatusEvent, StepStatus, read_many_events
from executor.store.lease import LeaseSettings, takeover_reason
from executor.store.step_rows import code_drifted

logger = logging.getLogger(__name__)

CLOSEST_NAMES = 5
"""How many step names an error about an unmatched pattern suggests."""


@dataclass(frozen=True)
class Decision:
    """What this run will do with one selected step, and why."""

    planned: PlannedStep
    action: str
    """"run", "skip", "wait" (a live worker holds it) or "take over" (its holder's lease is stale or released,
    or its process on this host is gone)."""
    reason: str
    force: bool = False
    drift: bool = False
    fresh: bool = False
    """The step has no status history yet (it never ran under this prefix)."""


def select(
    plan: Plan, run_only: Sequence[str] | None, force_run: Sequence[str], force_run_failed: bool
) -> list[Decision]:
    """Decide, for every step this run needs, whether it runs, is skipped or is waited for (plan order)."""
    roots = match_patterns(plan.steps, run_only, "run_only", plan.steps) if run_only else plan.requested
    closure = _blocking_closure(roots)
    candidates = [planned for planned in plan.steps if planned in closure]
    forced = set(match_patterns(candidates, force_run, "force_run", plan.steps))
    histories = read_many_events([planned.output_path for planned in candidates])
    last_event = {
        planned: events[-1] if events else None for planned, events in zip(candidates, histories, strict=True)
    }
    decision_of = {planned: _decide(planned, last_event[planned], planned in forced) for planned in candidates}
    needed = _needed([*roots, *forced], decision_of)
    decisions = [decision_of[planned] for planned in candidates if planned in needed]
    for decision in decisions:
        if decision.drift:
            _warn_drift(decision.planned)
    failed_before = [
        decision.planned
        for decision in decisions
        if not decision.force and _status(last_event[decision.planned]) == StepStatus.FAILED
    ]
    if failed_before and not force_run_failed:
        listed = "; ".join(f"{planned.label} ({planned.output_path})" for planned in failed_before)
        patterns = ",".join(f"^{re.escape(planned.name)}$" for planned in failed_before)
        raise StepFailedError(
            f"{len(failed_before)} step(s) failed previously and force_run_failed is false: {listed}. "
            "Read their logs/step.log, fix the cause, then rerun with --force_run_failed true "
            f"(or --force_run '{patterns}' for just these steps; force_run=[...] from Python).",
            failed=[planned.label for planned in failed_before],
        )
    return decisions


def match_patterns(
    candidates: Sequence[PlannedStep], patterns: Sequence[str], what: str, every_step: Sequence[PlannedStep]
) -> list[PlannedStep]:
    """The candidates whose whole name a pattern matches (executor/dag/patterns.py); a pattern matching none, invalid
    or reading as a glob is a `ConfigError`."""
    matched: dict[PlannedStep, None] = {}
    for pattern in patterns:
        regex = compile_pattern(pattern, what, (planned.name for planned in every_step))
        hits = [planned for planned in candidates if regex.fullmatch(planned.name)]
        if not hits:
            raise ConfigError(_no_match_message(pattern, what, regex, candidates, every_step))
        matched.update(dict.fromkeys(hits))
    return list(matched)


def _no_match_message(
    pattern: str,
    what: str,
    regex: re.Pattern[str],
    candidates: Sequence[PlannedStep],
    every_step: Sequence[PlannedStep],
) -> str:
    names = list(dict.fromkeys(planned.name for planned in candidates))
    closest = difflib.get_close_matches(pattern, names, n=CLOSEST_NAMES, cutoff=0.0)
    outside = sorted({planned.name for planned in every_step if regex.fullmatch(planned.name)})
    if outside:
        return (
            f"{what} pattern {pattern!r} matches no step selected by this run; it matches {', '.join(outside)}, "
            "which no selected step blocks on (select them with run_only, or pass them to run()). "
            f"Selected step names closest to it: {', '.join(closest)}"
        )
    return (
        f"{what} pattern {pattern!r} matches no step of this DAG (patterns are regexes matched against the whole "
        "step name: 'stats' is that step only, '.*stats' any name ending so); "
        f"closest step names: {', '.join(closest)}. Nothing was run or written"
    )


def _blocking_closure(roots: Iterable[PlannedStep]) -> set[PlannedStep]:
    selected: set[PlannedStep] = set()
    stack = list(roots)
    while stack:
        planned = stack.pop()
        if planned not in selected:
            selected.add(planned)
            stack.extend(planned.blocking)
    return selected


def _needed(roots: Iterable[PlannedStep], decision_of: dict[PlannedStep, Decision]) -> set[PlannedStep]:
    """The roots, and the blocking dependencies of every needed step that is not skipped."""
    needed: set[PlannedStep] = set()
    stack = list(roots)
    while stack:
        planned = stack.pop()
        if planned in needed:
            continue
        needed.add(planned)
        if decision_of[planned].action != "skip":
            stack.extend(planned.blocking)
    return needed


def _status(event: StatusEvent | None) -> StepStatus | None:
    return event.status if event is not None else None


def _decide(planned: PlannedStep, last: StatusEvent | None, forced: bool) -> Decision:
    if forced:
        return Decision(planned, "run", "force_run matched", force=True, fresh=last is None)
    if last is None:
        return Decision(planned, "run", "no output yet", fresh=True)
    if last.status == StepStatus.SUCCESS:
        drift = code_drifted(last.details.get("code_fingerprint"), planned.fingerprint)
        reason = f"SUCCESS at {last.time}" + ("; code drift: fn changed since" if drift else "")
        return Decision(planned, "skip", reason, drift=drift)
    if last.status == StepStatus.FAILED:
        return Decision(planned, "run", f"FAILED at {last.time}; rerunning (force_run_failed)")
    if last.status == StepStatus.RUNNING:
        takeover = takeover_reason(planned.output_path, LeaseSettings.from_env())
        if takeover is not None:
            return Decision(planned, "take over", f"RUNNING in {last.worker} since {last.time}; lease: {takeover}")
        return Decision(planned, "wait", f"RUNNING in {last.worker} since {last.time}")
    return Decision(planned, "run", f"{last.status} at {last.time}")


def _warn_drift(planned: PlannedStep) -> None:
    logger.warning(
        "%s: code drift: %s changed since this output was written (%s); keeping the output "
        "because code is not hashed. Bump code_version or use --force_run %s to rerun it.",
        planned.label,
        planned.fn_name,
        planned.output_path,
        re.escape(planned.name),
    )
