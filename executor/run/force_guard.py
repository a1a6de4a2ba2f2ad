"""What a forced rerun would throw away, said before it is: the checkpoints of a forced step.

A forced step starts from an empty output folder (executor/run/step_runner.py deletes its old outputs once it holds
the lease). For most steps that is minutes of recomputation; for a train step it is the training run itself,
whose `checkpoints/` may hold days of accelerator time. So before anything runs, every forced step whose
output holds a non-empty `checkpoints/` folder is listed, by step, path and checkpoint, and the run goes on
only if the caller confirms: `--yes` on the command line, or an answer typed at a terminal
(`executor_main`). Without either the run stops with a `ForceDiscardError` that lists them; nothing is
written. A dry run prints the list. From Python, `Executor.run(force_run=...)` is explicit enough and goes on
(with a warning naming what it discards) unless `confirm_discard` is given.

This is the one place the generic runner knows a training convention, said here so nobody has to find it: the
folder name (`layout.CHECKPOINTS_DIR`, what steps/train writes) and Levanter's `step-N` names, used only to list
the newest checkpoints first. A step of any other kind with a `checkpoints/` folder is guarded the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from executor.errors import ConfigError
from executor.run.selection import Decision
from executor.store import storage
from executor.store.layout import CHECKPOINTS_DIR

logger = logging.getLogger(__name__)

SHOWN_CHECKPOINTS = 5
"""How many of a step's checkpoints the list names (the newest ones); the rest are counted."""


class ForceDiscardError(ConfigError):
    """A forced rerun would discard checkpoints and was not confirmed; the message lists them."""


def discarded_checkpoints(decisions: Sequence[Decision]) -> list[str]:
    """One line per forced step whose output holds checkpoints: `label (path): N checkpoint(s): ...`."""
    forced = [decision.planned for decision in decisions if decision.force and not decision.fresh]
    folders = [storage.join(planned.output_path, CHECKPOINTS_DIR) for planned in forced]
    listings = storage.list_details_many(folders)
    lines = []
    for planned, folder, listing in zip(forced, folders, listings, strict=True):
        names = sorted((storage.basename(entry["name"].rstrip("/")) for entry in listing), key=_checkpoint_order)
        if not names:
            continue
        shown = ", ".join(names[-SHOWN_CHECKPOINTS:])
        more = f" and {len(names) - SHOWN_CHECKPOINTS} older" if len(names) > SHOWN_CHECKPOINTS else ""
        lines.append(f"{planned.label} ({folder}): {len(names)} checkpoint(s): {shown}{more}")
    return lines


def _checkpoint_order(name: str) -> tuple[int, str]:
    """`step-9` before `step-10`: Levanter names checkpoints by the step they hold."""
    number = name.rpartition("-")[2]
    return (int(number), name) if number.isdigit() else (-1, name)


def confirm_or_refuse(lines: list[str], confirm_discard: Callable[[str], bool] | None) -> None:
    """Go on if nothing is discarded, the caller confirms, or no confirmer was given (Python); else refuse."""
    if not lines:
        return
    listing = "; ".join(lines)
    if confirm_discard is None:
        logger.warning("force_run discards the checkpoints of %d step(s): %s", len(lines), listing)
        return
    question = f"--force_run would discard the checkpoints of {len(lines)} step(s): {listing}"
    if not confirm_discard(question):
        raise ForceDiscardError(
            f"{question}. Rerun with --yes to discard them, or narrow --force_run (step patterns match whole step "
            "names). Nothing was run or written"
        )
