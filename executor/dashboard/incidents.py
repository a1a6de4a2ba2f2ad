"""A run's incidents in public: one timeline of what happened to it, and its goodput.

Fed only from the records the executor and the run already write:

- `.executor_status`: each attempt's start; a failure and its cause (the exception's first line), whether it
  was retried (WAITING "attempt n failed (transient): ...") or final (FAILED), a gang torn down (a failure
  whose cause names the gang or a lost host), a lease taken over (a RUNNING of a newer lease with no failure
  recorded before it: the holder was lost), the final SUCCESS;
- `metrics.jsonl`: a resume from a checkpoint, where a line's step is not past the newest before it (the
  steps redone: the run had reached step M and went on from N <= M);
- `alerts.jsonl`: each alert; `lineage.json`: the fork or rollback it started as.

An experiment's timeline (`experiment_incidents`) gathers the failures, retries and takeovers of its steps.

**Goodput** is the share of the run's wall time (its first RUNNING to its last record) spent advancing
training: the time between consecutive metrics lines of one attempt whose step is new. The rest is given by
cause: steps redone after a resume, starting (an attempt's RUNNING to its first line: compiling, loading the
checkpoint), and between attempts (a failure to the next start: backoff, a restarted gang, a lost worker).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from executor.status import StatusEvent

MAX_EXPERIMENT_STEPS = 200
"""Steps whose histories an experiment's timeline reads at most: those with a failure or a second attempt."""
GANG_WORDS = ("gang", "host lost", "lost host", "member", "placement group")


def _seconds(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def _iso(seconds: Any) -> str | None:
    """A record's unix time as the status history writes times (None when it has none)."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat() if isinstance(seconds, int | float) else None


def _cause(message: str | None) -> str:
    return (message or "").split("\n", 1)[0][:300]


def status_incidents(events: Sequence[StatusEvent]) -> list[dict[str, Any]]:
    """The timeline's entries from a step's status history (module docstring)."""
    found: list[dict[str, Any]] = []
    newest_lease, failed_since_start = None, False
    for event in events:
        status, entry = str(event.status), {"time": event.time, "attempt": event.attempt}
        if status == "RUNNING":
            newer = newest_lease is not None and event.lease is not None and event.lease > newest_lease
            if newer and not failed_since_start:
                text = f"lease {event.lease} took the step over: its holder was lost"
                found.append({**entry, "kind": "takeover", "text": text})
            found.append({**entry, "kind": "start", "text": f"attempt {event.attempt} started"})
            newest_lease, failed_since_start = event.lease if event.lease is not None else newest_lease, False
        elif status in ("WAITING", "FAILED") and event.attempt:
            cause = _cause(event.message)
            gang = any(word in cause.lower() for word in GANG_WORDS)
            kind = "gang" if gang else ("retry" if status == "WAITING" else "failure")
            found.append({**entry, "kind": kind, "text": cause or f"attempt {event.attempt} failed"})
            failed_since_start = True
        elif status == "SUCCESS":
            found.append({**entry, "kind": "success", "text": f"finished (attempt {event.attempt})"})
    return found


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
    advancing = redone = starting = 0.0
    boundaries = sorted(starts)
    seen: set[int] = set()
    previous: float | None = None
    for when, step in timed:
        attempt_start = max((start for start in boundaries if start <= when), default=None)
        if previous is None or (attempt_start is not None and previous < attempt_start):
            starting += when - attempt_start if attempt_start is not None else 0.0  # this attempt's first line
        elif step in seen:
            redone += when - previous
        else:
            advancing += when - previous
        seen.add(step)
        previous = when
    causes = {"redone after a resume": redone, "starting (compile, restore)": starting,
              "between attempts (failures, restarts)": max(0.0, total - advancing - redone - starting)}  # fmt: skip
    return {"wall_s": total, "advancing_s": advancing, "goodput": advancing / total if total > 0 else None,
            "lost_s": causes}  # fmt: skip


def run_incidents(
    events: Sequence[StatusEvent],
    lines: Sequence[Mapping[str, Any]],
    alerts: Sequence[Mapping[str, Any]],
    lineage: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The run's timeline (oldest first) and goodput."""
    timeline = status_incidents(events) + resumes(lines)
    timeline += [{"time": _iso(alert.get("time")), "kind": "alert", "step": alert.get("step"),
                  "text": f"{alert.get('rule')}: {alert.get('message')}"} for alert in alerts]  # fmt: skip
    if lineage:
        parent = lineage.get("parent") or "a run outside this prefix"
        timeline.append({"time": events[0].time if events else None, "kind": "fork", "step": lineage.get("step"),
                         "text": f"forked from {parent} at step {lineage.get('step')}"})  # fmt: skip
    timeline.sort(key=lambda entry: entry["time"] or "")
    return {"timeline": timeline, "goodput": goodput(events, lines)}


def experiment_incidents(steps: Sequence[Any], states: Sequence[Any], histories: Any) -> dict[str, Any]:
    """An experiment's timeline: the incidents (not the plain starts and finishes) of each step that failed or
    took more than one attempt, each with its step's name and path, oldest first. `histories(paths)` reads the
    status histories of the steps chosen (at most MAX_EXPERIMENT_STEPS)."""
    chosen = [step for step, state in zip(steps, states, strict=True)
              if state.attempts > 1 or state.status in ("FAILED", "DEP_FAILED")][:MAX_EXPERIMENT_STEPS]  # fmt: skip
    timeline = []
    for step, events in zip(chosen, histories([step.output_path for step in chosen]), strict=True):
        for entry in status_incidents(events):
            if entry["kind"] not in ("start", "success"):
                timeline.append({**entry, "step_name": step.name, "path": step.relative})
    timeline.sort(key=lambda entry: entry["time"] or "")
    return {"timeline": timeline, "steps": len(chosen)}
