"""A run's incidents in public: one timeline of what happened to it, and its goodput.

Fed only from the records the executor and the run already write:

- `.executor_status`: each attempt's start; a failure and its cause (the exception's first line), whether it
  was retried (WAITING "attempt n failed (transient): ...") or final (FAILED), a gang torn down (a failure
  whose cause names the gang or a lost host), a lease taken over (a RUNNING of a newer lease with no failure
  recorded before it: the holder was lost), the final SUCCESS;
- `metrics.jsonl`: a resume from a checkpoint, where a line's step is not past the newest before it (the
  steps redone: the run had reached step M and went on from N <= M);
- `alerts.jsonl`: each alert; `lineage.json`: the fork or rollback it started as;
- code drift: the code fingerprint its SUCCESS recorded against the one the newest experiment holding the step
  planned with (`CodeNow`: the code as it is now; executor/run/selection.py warns of the same at the rerun's skip),
  dated when that experiment was written, naming the function, both fingerprints and both git commits.

A restart (an attempt after a failure) and a resume say what they followed: the failure's cause (`after`).

An experiment's timeline (`experiment_incidents`) gathers the failures, retries, takeovers and code drift of its
steps.

Each attempt's start, end and how it ended (`attempt_history`): finished, failed or retried with the cause, or
lost (no end recorded: killed, its host gone), ended at its lease's last heartbeat, taken over by the next.

**Goodput** is the share of the run's wall time (its first RUNNING to its last record) spent advancing
training: the time between consecutive metrics lines of one attempt whose step is new, or that log the same
step's other figures (Levanter logs throughput on a line of its own). The rest is given by cause: steps redone
after a resume, evaluating (from the line before to a line carrying `eval/` figures), starting (an attempt's
RUNNING to its first line: compiling, loading the checkpoint), finishing (the last line to the SUCCESS: the final
checkpoint and the export), and between attempts (a failure to the next start: backoff, a restarted gang, a lost
worker).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from executor.store.events import StatusEvent
from executor.store.step_rows import StepState

MAX_EXPERIMENT_STEPS = 200
"""Steps whose histories an experiment's timeline reads at most: those with a failure or a second attempt."""
GANG_WORDS = ("gang", "host lost", "lost host", "member", "placement group")
TEARDOWN = "the gang is torn down"


def _seconds(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def _iso(seconds: Any) -> str | None:
    """A record's unix time as the status history writes times (None when it has none)."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat() if isinstance(seconds, int | float) else None


def _cause(message: str | None) -> str:
    return (message or "").split("\n", 1)[0][:300]


def _with_teardown(cause: str, message: str | None) -> str:
    """A gang failure's first line and, where a lost member's reason ran over lines (Ray's actor errors), the
    sentence of executor/run/gang.py's message that says what was done about it (the teardown, the new gang)."""
    _, found, rest = (message or "").partition(TEARDOWN)
    return f"{cause} ... {TEARDOWN}{_cause(rest)}" if found and TEARDOWN not in cause else cause


def status_incidents(events: Sequence[StatusEvent]) -> list[dict[str, Any]]:
    """The timeline's entries from a step's status history (module docstring)."""
    found: list[dict[str, Any]] = []
    newest_lease, failure = None, None
    for event in events:
        status, entry = str(event.status), {"time": event.time, "attempt": event.attempt}
        if status == "RUNNING":
            newer = newest_lease is not None and event.lease is not None and event.lease > newest_lease
            if newer and failure is None:
                text = f"lease {event.lease} took the step over: its holder was lost"
                found.append({**entry, "kind": "takeover", "text": text})
                failure = f"a takeover (lease {event.lease}): its holder was lost"
            start = {**entry, "kind": "start", "text": f"attempt {event.attempt} started"}
            if failure is not None:
                start |= {"after": failure, "text": f"attempt {event.attempt} started, after {failure}"}
            found.append(start)
            newest_lease, failure = event.lease if event.lease is not None else newest_lease, None
        elif status in ("WAITING", "FAILED") and event.attempt:
            cause = _cause(event.message)
            gang = any(word in cause.lower() for word in GANG_WORDS)
            cause = _with_teardown(cause, event.message) if gang else cause
            kind = "gang" if gang else ("retry" if status == "WAITING" else "failure")
            found.append({**entry, "kind": kind, "text": cause or f"attempt {event.attempt} failed"})
            failure = f"{'a gang teardown' if gang else 'a failure'} ({cause[:200]})"
        elif status == "SUCCESS":
            found.append({**entry, "kind": "success", "text": f"finished (attempt {event.attempt})"})
    return found


def attempt_history(
    events: Sequence[StatusEvent], heartbeat_of: Callable[[int], str | None] | None = None
) -> list[dict[str, Any]]:
    """Each attempt: {attempt, started, ended, outcome, cause}. outcome: running, succeeded, retried, failed, or
    lost (no end recorded before a newer lease took over: `ended` is its lease's last heartbeat, by
    `heartbeat_of(lease number)`, and `cause` says who took over when)."""
    attempts: list[dict[str, Any]] = []
    for event in events:
        status, current = str(event.status), attempts[-1] if attempts else None
        if status == "RUNNING":
            if current is not None and current["outcome"] == "running":
                seen = heartbeat_of(current["lease"]) if heartbeat_of and current["lease"] is not None else None
                cause = (f"no end recorded (killed, or its host lost); last heartbeat {seen or 'unknown'}; "
                         f"attempt {event.attempt} took over at {event.time}")  # fmt: skip
                current |= {"outcome": "lost", "ended": seen, "cause": cause}
            attempts.append({"attempt": event.attempt, "started": event.time, "ended": None, "outcome": "running",
                             "cause": None, "lease": event.lease})  # fmt: skip
        elif current is not None and current["outcome"] == "running" and status in ("SUCCESS", "WAITING", "FAILED"):
            outcome = {"SUCCESS": "succeeded", "WAITING": "retried", "FAILED": "failed"}[status]
            reason = None if status == "SUCCESS" else _cause(event.message) or f"attempt {event.attempt} failed"
            current |= {"outcome": outcome, "ended": event.time, "cause": reason}
    return attempts


def resumes(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each point where the lines go back (a resume from a checkpoint): the step resumed at, the steps redone."""
    found: list[dict[str, Any]] = []
    newest = previous = None
    for line in rows:
        step = line.get("step")
        if not isinstance(step, int):
            continue
        if previous is not None and newest is not None and step < previous:  # a step's later lines repeat it
            text = f"resumed at step {step} from a checkpoint: steps {step}-{newest} redone"
            found.append({"time": _iso(line.get("time")), "kind": "resume", "step": step, "redone": newest - step + 1,
                          "text": text})  # fmt: skip
        newest = step if newest is None else max(newest, step)
        previous = step
    return found


def goodput(events: Sequence[StatusEvent], lines: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Wall time by cause (module docstring); None without a start and timed lines."""
    starts = [_seconds(event.time) for event in events if str(event.status) == "RUNNING"]
    timed = [(float(line["time"]), line["step"]) for line in lines
             if isinstance(line.get("time"), int | float) and isinstance(line.get("step"), int)]  # fmt: skip
    if not starts or not timed:
        return None
    ends = [_seconds(event.time) for event in events if str(event.status) in ("SUCCESS", "FAILED", "WAITING")]
    total = max([*ends, timed[-1][0]]) - starts[0]
    finished = [_seconds(event.time) for event in events if str(event.status) == "SUCCESS"]
    finishing = max(0.0, finished[-1] - timed[-1][0]) if finished and finished[-1] >= max(starts) else 0.0
    evals = {index for index, line in enumerate(lines) if any(str(key).startswith("eval/") for key in line)}
    timed_evals = [index in evals for index, line in enumerate(lines)
                   if isinstance(line.get("time"), int | float) and isinstance(line.get("step"), int)]  # fmt: skip
    advancing = redone = starting = evaluating = 0.0
    boundaries = sorted(starts)
    seen: set[int] = set()
    previous: float | None = None
    previous_step: int | None = None
    for (when, step), is_eval in zip(timed, timed_evals, strict=True):
        attempt_start = max((start for start in boundaries if start <= when), default=None)
        if previous is None or (attempt_start is not None and previous < attempt_start):
            starting += when - attempt_start if attempt_start is not None else 0.0  # this attempt's first line
        elif is_eval:  # Levanter's evals log on lines of their own, at the step just trained
            evaluating += when - previous
        elif step == previous_step:  # the same step's other figures (throughput): part of the step
            advancing += when - previous
        elif step in seen:
            redone += when - previous
        else:
            advancing += when - previous
        seen.add(step)
        previous, previous_step = when, step
    between = max(0.0, total - advancing - redone - starting - evaluating - finishing)
    causes = {"redone after a resume": redone, "starting (compile, restore)": starting,
              "evaluating": evaluating, "finishing (final checkpoint, export)": finishing,
              "between attempts (failures, restarts)": between}  # fmt: skip
    return {"wall_s": total, "advancing_s": advancing, "goodput": advancing / total if total > 0 else None,
            "lost_s": causes}  # fmt: skip


@dataclass(frozen=True)
class CodeNow:
    """The step's code as it is now: what the newest experiment holding the step planned it with."""

    fingerprint: str | None
    fn: str | None
    git_commit: str | None
    experiment: str
    """That experiment's file name (under `<prefix>/experiments`)."""
    created: str | None
    """When that experiment was written: the incident's time."""


def code_drift(
    name: str, events: Sequence[StatusEvent], info: Mapping[str, Any] | None, now: CodeNow | None
) -> dict[str, Any] | None:
    """A `code_drift` entry when the fingerprint the step's SUCCESS recorded is not the code's now; `info` is the
    step's `.executor_info` (the function and git commit the output was written with). None: no drift known."""
    state = StepState.of(events)
    if now is None or not state.drifted(now.fingerprint):
        return None
    last, recorded, current = events[-1], state.recorded_fingerprint or "", now.fingerprint or ""
    info = info or {}
    fn_then, commit_then = info.get("fn"), info.get("git_commit")
    function = f"{fn_then} (now {now.fn})" if now.fn and fn_then and now.fn != fn_then else (now.fn or fn_then)
    if commit_then and now.git_commit and commit_then != now.git_commit:
        commits = f"git commit {commit_then[:12]} -> {now.git_commit[:12]}"
    else:
        commits = f"the same git commit {(now.git_commit or commit_then or '?')[:12]}: an uncommitted edit"
    text = (f"code drift: {function} changed since this output was written at {last.time} (code fingerprint "
            f"{recorded[:12]} -> {current[:12]}, {commits}; planned so by {now.experiment}). The output is "
            f"kept (code is not hashed): bump code_version or --force_run {name} to rebuild it")  # fmt: skip
    return {"time": now.created or last.time, "kind": "code_drift", "attempt": last.attempt, "fn": function,
            "recorded": recorded, "current": current, "experiment": now.experiment, "text": text}  # fmt: skip


def code_now(experiment: Any, relative: str) -> CodeNow | None:
    """The code of the step stored at `relative` as `experiment` (an executor/watch/experiment_index.Experiment)
    planned it; None when the experiment does not hold it."""
    step = experiment.by_relative.get(relative) if experiment is not None else None
    if step is None:
        return None
    return CodeNow(step.fingerprint, step.fn, experiment.git_commit, experiment.file, experiment.created)


def attempt_of(events: Sequence[StatusEvent], when: str | None) -> str | None:
    """What the attempt running at `when` followed (status_incidents' `after`), None for a first attempt."""
    if when is None:
        return None
    after = None
    for entry in status_incidents(events):
        if entry["kind"] == "start" and _seconds(entry["time"]) <= _seconds(when):
            after = entry.get("after")
    return after


def run_incidents(
    events: Sequence[StatusEvent],
    lines: Sequence[Mapping[str, Any]],
    alerts: Sequence[Mapping[str, Any]],
    lineage: Mapping[str, Any] | None,
    drift: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's timeline (oldest first) and goodput; `drift`: its `code_drift` entry, if any."""
    timeline = status_incidents(events)
    for resume in resumes(lines):
        after = attempt_of(events, resume["time"])
        timeline.append(resume | ({"after": after, "text": f"{resume['text']}, after {after}"} if after else {}))
    if drift:
        timeline.append(dict(drift))
    timeline += [{"time": _iso(alert.get("time")), "kind": "alert", "step": alert.get("step"),
                  "text": f"{alert.get('rule')}: {alert.get('message')}"} for alert in alerts]  # fmt: skip
    if lineage:
        parent = lineage.get("parent") or "a run outside this prefix"
        timeline.append({"time": events[0].time if events else None, "kind": "fork", "step": lineage.get("step"),
                         "text": f"forked from {parent} at step {lineage.get('step')}"})  # fmt: skip
    timeline.sort(key=lambda entry: entry["time"] or "")
    return {"timeline": timeline, "goodput": goodput(events, lines)}


def experiment_incidents(
    experiment: Any, states: Sequence[Any], histories: Any, infos: Any, lines_of: Any = None
) -> dict[str, Any]:
    """An experiment's timeline: the incidents (not the plain starts and finishes) of each step that failed,
    took more than one attempt or whose code drifted from the experiment's, each with its step's name and path,
    oldest first, and the resumes of those with more than one attempt. `histories(paths)` reads the status
    histories of the steps chosen (at most MAX_EXPERIMENT_STEPS), `infos(paths)` their `.executor_info`s (read for
    the drifted ones only), `lines_of(paths)` the metrics lines of those restarted (None: no resumes)."""
    steps = experiment.steps
    drifted = {step.relative for step, state in zip(steps, states, strict=True) if state.drifted(step.fingerprint)}
    chosen = [
        step
        for step, state in zip(steps, states, strict=True)
        if state.attempts > 1 or state.status in ("FAILED", "DEP_FAILED") or step.relative in drifted
    ]
    chosen = chosen[:MAX_EXPERIMENT_STEPS]
    drifted_steps = [step for step in chosen if step.relative in drifted]
    info_of = dict(zip([step.relative for step in drifted_steps],
                       infos([step.output_path for step in drifted_steps]), strict=True))  # fmt: skip
    restarted = [step for step, state in zip(steps, states, strict=True) if state.attempts > 1 and step in chosen]
    lines = dict(zip([step.relative for step in restarted], lines_of([step.output_path for step in restarted]),
                     strict=True)) if lines_of else {}  # fmt: skip
    timeline = []
    for step, events in zip(chosen, histories([step.output_path for step in chosen]), strict=True):
        entries = [entry for entry in status_incidents(events) if entry["kind"] not in ("start", "success")]
        for resume in resumes(lines.get(step.relative) or []):
            after = attempt_of(events, resume["time"])
            entries.append(resume | ({"after": after, "text": f"{resume['text']}, after {after}"} if after else {}))
        drift = code_drift(step.name, events, info_of.get(step.relative), code_now(experiment, step.relative))
        timeline += [{**entry, "step_name": step.name, "path": step.relative} for entry in [*entries, drift] if entry]
    timeline.sort(key=lambda entry: entry["time"] or "")
    return {"timeline": timeline, "steps": len(chosen)}
