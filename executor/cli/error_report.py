"""How an experiment's command line reports a mistake the user can fix: the message, not the executor.

A `ConfigError` (a typo in `--force_run`, a pattern that matches no step, `--max_concurrent 0`) or a
`StepFailedError` that reaches the top of `python experiments/foo.py` would otherwise print a long
traceback through the executor's own frames (planning, selection, scheduling), which says nothing
the message does not. `executor_main` installs `report_user_error` as `sys.excepthook`:

    Traceback (your code only; the executor's frames are hidden):
      File "experiments/mine.py", line 40, in <module>
        executor_main([stats])
    StepFailedError: 1 step(s) failed: stats-1a2b3c4d: ValueError: no docs (log: .../logs/step.log)

    stats-1a2b3c4d raised (from its .executor_status):
      ...the last lines of the step's own traceback...
    last lines of .../logs/step.log:
      ...
    Rerunning the same command retries the failed step(s) ...

Only uncaught `ExecutorError`s are handled this way; any other exception (a bug) keeps Python's
full traceback. Tests and library callers still get the exception itself: the hook only runs when
nothing caught it.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

from executor.errors import ExecutorError, StepFailedError
from executor.store import storage
from executor.store.events import StepStatus, read_events
from executor.store.layout import LOG_FILE

STEP_TRACEBACK_LINES = 12
"""How many lines of a failed step's own traceback (its innermost frames and the exception) are shown."""
LOG_TAIL_LINES = 10
"""How many last lines of a failed step's `logs/step.log` are shown."""

_EXECUTOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def install_excepthook() -> None:
    """Report uncaught `ExecutorError`s as `report_user_error` does (idempotent)."""
    if sys.excepthook is not report_user_error:
        _previous_hook[0] = sys.excepthook
        sys.excepthook = report_user_error


_previous_hook = [sys.excepthook]


def report_user_error(error_type: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    if not isinstance(error, ExecutorError):
        _previous_hook[0](error_type, error, trace)
        return
    print(render_user_error(error, trace), file=sys.stderr)


def _is_executor_frame(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_EXECUTOR_DIR + os.sep)


def render_user_error(error: ExecutorError, trace: TracebackType | None) -> str:
    """The user's own frames, the message, and for failed steps what they raised and logged."""
    frames = [frame for frame in traceback.extract_tb(trace) if not _is_executor_frame(frame.filename)]
    lines = []
    if frames:
        lines.append("Traceback (your code only; the executor's frames are hidden):")
        lines.extend(line.rstrip("\n") for line in traceback.format_list(frames))
    lines.append(f"{type(error).__name__}: {error}")
    if isinstance(error, StepFailedError):
        for label, output_path in error.output_paths.items():
            lines.extend(["", *failed_step_details(label, output_path)])
        if error.output_paths:
            lines.append(
                "\nRerunning the same command retries the failed step(s) (force_run_failed is on by default) and "
                "then runs what depends on them; finished steps are skipped."
            )
    return "\n".join(lines)


def _without_executor_frames(traceback_lines: list[str]) -> list[str]:
    """A formatted traceback less the executor's frames (each a `File "..."` line and its source lines)."""
    kept: list[str] = []
    skipping = False
    for line in traceback_lines:
        if line.startswith('  File "'):
            skipping = _is_executor_frame(line.split('"')[1])
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return kept


def failed_step_details(label: str, output_path: str) -> list[str]:
    """The end of the traceback a failed step recorded, and the last lines of its log."""
    events = read_events(output_path)
    failures = [event for event in events if event.status == StepStatus.FAILED]
    lines = []
    step_traceback = failures[-1].details.get("traceback") if failures else None
    if step_traceback:
        lines.append(f"{label} raised (from its .executor_status):")
        shown = _without_executor_frames(step_traceback.rstrip("\n").splitlines())
        lines.extend(f"  {line}" for line in shown[-STEP_TRACEBACK_LINES:])
    log_path = storage.join(output_path, LOG_FILE)
    log = (storage.read_text(log_path) or "").rstrip()
    if step_traceback:  # the log holds the traceback shown above: show what the step logged around it
        at = log.rfind(step_traceback.rstrip())
        if at >= 0:
            log = log[:at] + log[at + len(step_traceback.rstrip()) :].lstrip("\n")
    if log:
        lines.append(f"last lines of {log_path}:")
        lines.extend(f"  {line}" for line in log.rstrip("\n").splitlines()[-LOG_TAIL_LINES:])
    return lines
