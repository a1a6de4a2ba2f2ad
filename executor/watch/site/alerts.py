"""The publisher's alerts: every rule of watch/training/alerts.py on a run whose files changed, and on a running run
whose files did not, the stall rule alone, from what the last full look kept.

A stall is the one rule that fires on *no* change (a live lease, no new line for the run's allowance,
training/stall_rule.py), and an idle cycle opens no metrics file (changes.py). So each full look at a RUNNING run
keeps its rules, its allowance and its newest line's (time, step); an idle cycle checks the lease (a few small
reads) and that time against the clock. Firings are appended to `<run>/alerts.jsonl` once per episode, logged, and
POSTed to the webhook.

A run whose stall has fired and that has written no line since is *stalled* (`stalled`: since when, at which
step, after what allowance), until a full look finds a newer line or the step no longer running: the publisher
puts that on the step's live answer, its experiment's step table and counts and the experiment list, so every
page says the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from executor.store import storage
from executor.store.experiments import ExperimentStep
from executor.store.layout import MIXTURE_FILE
from executor.store.lease import LeaseSettings, takeover_reason
from executor.watch.training import alerts
from executor.watch.training.panels import predicted_curve, read_json
from executor.watch.training.stall_rule import stalled_since

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningRun:
    """What the stall rule needs of a RUNNING run between full looks."""

    rules: alerts.AlertRules
    newest: dict[str, Any] | None
    """Its newest metrics line's time and step (None before its first line)."""
    after_s: float
    """Its stall allowance (training/stall_rule.py), derived at the full look."""


class RunAlerts:
    def __init__(self, prefix: str, webhook_url: str | None, clock: Callable[[], float]):
        self.prefix = prefix
        self.webhook_url = webhook_url
        self.clock = clock
        self.running: dict[str, RunningRun] = {}
        """RUNNING runs at their last full look, by relative path."""
        self.stalled: dict[str, dict[str, Any]] = {}
        """Runs stalled now (module docstring), by relative path: {"since", "step", "after_s"}."""

    def evaluate(self, step: ExperimentStep, running: bool, records: list[dict[str, Any]]) -> int:
        """Every rule on the run's metrics lines so far (`records`); returns how many alerts are new."""
        rules = alerts.step_rules(step.output_path, f"step {step.name} ({step.relative})")
        curve, _, _ = predicted_curve(self.prefix, step.output_path)
        newest, after_s = alerts.stall_inputs(step.output_path, rules)  # a long run's newest lines, not its first
        if running:
            self.running[step.relative] = RunningRun(rules, newest, after_s)
        else:
            self.running.pop(step.relative, None)
        live_lease = running and takeover_reason(step.output_path, LeaseSettings.from_env()) is None
        mixture = read_json(storage.join(step.output_path, MIXTURE_FILE), MIXTURE_FILE)
        fired = alerts.evaluate(records, rules, now=self.clock(), curve=curve, mixture=mixture)
        if live_lease:
            fired += alerts.stalled([newest] if newest else [], rules, self.clock(), after_s)
        self._mark_stalled(step.relative, newest, after_s, live_lease)
        return self._record(step, rules, fired)

    def _mark_stalled(self, relative: str, newest: dict[str, Any] | None, after_s: float, live: bool) -> None:
        """Keep in `stalled` whether the run is stalled now (stall_rule.stalled_since, its lease live)."""
        stall = stalled_since(newest, after_s, self.clock()) if live else None
        if stall is None:
            self.stalled.pop(relative, None)
        else:
            self.stalled[relative] = stall

    def check_stall(self, step: ExperimentStep) -> int:
        """The stall rule alone on a RUNNING run whose files did not change; returns how many alerts are new."""
        run = self.running[step.relative]
        if takeover_reason(step.output_path, LeaseSettings.from_env()) is not None:
            self.stalled.pop(step.relative, None)
            return 0  # no live lease: the step is not running any more, whatever its status says
        fired = alerts.stalled([run.newest] if run.newest else [], run.rules, self.clock(), run.after_s)
        self._mark_stalled(step.relative, run.newest, run.after_s, live=True)
        return self._record(step, run.rules, fired)

    def _record(self, step: ExperimentStep, rules: alerts.AlertRules, fired: Sequence[alerts.Alert]) -> int:
        new = alerts.record_alerts(step.output_path, fired)
        hook = rules.webhook_url or self.webhook_url
        if new and hook:
            alerts.post_webhook(hook, step.relative, new)
        for alert in new:
            logger.warning("alert %s on step %s (%s): %s", alert.rule, step.name, step.relative, alert.message)
        return len(new)
