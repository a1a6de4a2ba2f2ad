"""Which RUNNING runs are stalled now, for the live dashboard, which needs no publisher to say so.

The published site learns a stall from its publisher's alerts (site/alerts.py). The dashboard is often read with
no publisher running, so it applies the same rule itself (stall_rule.py): a step RUNNING with a live lease whose
newest metrics line is older than its allowance (its config's `alerts.stall_after_s`, else derived from its own
step time: two minutes for a run that steps every second) is stalled since that line, and the step's live answer,
its row in the step table, its experiment's count and the experiment list's all say so.

    stalls = LiveStalls()
    stalls.stalled(output_path, started)   # {"since": ISO time, "step": 19, "after_s": 120}, or None

Every open tab polls every two seconds, so a run's newest metrics lines (the last megabyte: training/alerts.py
`stall_inputs`, as the publisher reads them), config and lease are read at most every
`refresh_s` (its newest line, allowance and whether its lease is live are kept); between reads only the clock
moves, which is all a stall needs to appear. A stall shows, and ends, at most `refresh_s` late.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from executor.store.lease import holder_lost_note
from executor.watch.training.alerts import AlertConfigError, AlertRules, stall_inputs, step_rules
from executor.watch.training.stall_rule import stalled_since

logger = logging.getLogger(__name__)

REFRESH_S = 5.0


@dataclass(frozen=True)
class _Look:
    """What one read of a running run found."""

    read_at: float
    """time.monotonic() of the read."""
    started: str | None
    """The attempt it was read in: a new attempt is read at once."""
    newest: dict[str, Any] | None
    after_s: float
    live_lease: bool


class LiveStalls:
    """The stall of each RUNNING step a page asks about (module docstring); safe to share between threads."""

    def __init__(self, refresh_s: float = REFRESH_S):
        self.refresh_s = refresh_s
        self._looks: dict[str, _Look] = {}
        self._lock = threading.Lock()

    def stalled(self, output_path: str, started: str | None) -> dict[str, Any] | None:
        """The stall now of the step at `output_path`, recorded RUNNING since `started` (stall_rule.stalled_since),
        or None: not stalled, or its lease is not live (the holder is gone, which its page says instead)."""
        look = self._look(output_path, started)
        return stalled_since(look.newest, look.after_s, time.time()) if look.live_lease else None

    def _look(self, output_path: str, started: str | None) -> _Look:
        now = time.monotonic()
        with self._lock:
            kept = self._looks.get(output_path)
        if kept is not None and kept.started == started and now - kept.read_at <= self.refresh_s:
            return kept
        newest, after_s = stall_inputs(output_path, self._rules(output_path))
        live_lease = holder_lost_note(output_path, started) is None
        look = _Look(now, started, newest, after_s, live_lease)
        with self._lock:
            for path in [path for path, old in self._looks.items() if now - old.read_at > 10 * self.refresh_s]:
                del self._looks[path]  # steps no page asked about for a while: finished, or no longer shown
            self._looks[output_path] = look
        return look

    @staticmethod
    def _rules(output_path: str) -> AlertRules:
        """The step's rules; a config the alerts cannot read is the publisher's to refuse, not every page's."""
        where = f"step at {output_path}"
        try:
            return step_rules(output_path, where)
        except AlertConfigError as error:
            logger.warning("%s: the default stall allowance, its own cannot be read: %s", where, error)
            return AlertRules()
