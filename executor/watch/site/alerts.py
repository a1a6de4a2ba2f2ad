"""The publisher's alerts: every rule of watch/training/alerts.py on a run whose files changed, and on a running run
whose files did not, the stall rule alone, from what the last full look kept.

A stall is the one rule that fires on *no* change (a live lease, no new line for `stall_after_s`), and an idle
cycle opens no metrics file (changes.py). So each full look at a RUNNING run keeps its rules and its
newest line's (time, step); an idle cycle checks the lease (a few small reads) and that time against the clock.
Firings are appended to `<run>/alerts.jsonl` once per episode, logged, and POSTed to the webhook.
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
from executor.watch.training.panels import PanelError, predicted_curve, read_json, step_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningRun:
    """What the stall rule needs of a RUNNING run between full looks."""

    rules: alerts.AlertRules
    newest: dict[str, Any] | None
    """Its newest metrics line's time and step (None before its first line)."""


class RunAlerts:
    def __init__(self, prefix: str, webhook_url: str | None, clock: Callable[[], float]):
        self.prefix = prefix
        self.webhook_url = webhook_url
        self.clock = clock
        self.running: dict[str, RunningRun] = {}
        """RUNNING runs at their last full look, by relative path."""

    def evaluate(self, step: ExperimentStep, running: bool, records: list[dict[str, Any]]) -> int:
        """Every rule on the run's metrics lines so far (`records`); returns how many alerts are new."""
        where = f"step {step.name} ({step.relative})"
        try:
            config = step_config(step.output_path)
        except PanelError as error:
            logger.warning("%s: no config for its alerts: %s", where, error)
            config = {}
        rules = alerts.AlertRules.from_config(config.get("alerts"), where)
        curve, _, _ = predicted_curve(self.prefix, step.output_path)
        if running:
            self.running[step.relative] = RunningRun(rules, alerts.newest_line(records))
        else:
            self.running.pop(step.relative, None)
        live_lease = running and takeover_reason(step.output_path, LeaseSettings.from_env()) is None
        mixture = read_json(storage.join(step.output_path, MIXTURE_FILE), MIXTURE_FILE)
        fired = alerts.evaluate(records, rules, now=self.clock(), running=live_lease, curve=curve, mixture=mixture)
        return self._record(step, rules, fired)

    def check_stall(self, step: ExperimentStep) -> int:
        """The stall rule alone on a RUNNING run whose files did not change; returns how many alerts are new."""
        run = self.running[step.relative]
        if takeover_reason(step.output_path, LeaseSettings.from_env()) is not None:
            return 0  # no live lease: the step is not running any more, whatever its status says
        fired = alerts.stalled([run.newest] if run.newest else [], run.rules, self.clock())
        return self._record(step, run.rules, fired)

    def _record(self, step: ExperimentStep, rules: alerts.AlertRules, fired: Sequence[alerts.Alert]) -> int:
        new = alerts.record_alerts(step.output_path, fired)
        hook = rules.webhook_url or self.webhook_url
        if new and hook:
            alerts.post_webhook(hook, step.relative, new)
        for alert in new:
            logger.warning("alert %s on step %s (%s): %s", alert.rule, step.name, step.relative, alert.message)
        return len(new)
