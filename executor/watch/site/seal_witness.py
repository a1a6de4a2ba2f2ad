"""The seal of a run's prediction, witnessed outside the run: the public site's own `seal.json`.

A run seals the prediction it is watched against when it starts (`<run>/prediction_seal.json`: the prediction's
sha256 and when it was sealed, steps/train/train_metrics.py), but that file lives in the run's own prefix: a run,
or anyone who can write its prefix, could rewrite the seal and the prediction together and nothing would show it.
So the publisher, in the first cycle that sees the seal, writes what it saw to a place the run cannot rewrite
later, the published site:

    data/step/<R>/seal.json   {"run": R, "sha256": the sealed digest, "sealed_at": the run's time,
                               "seal_sha256": the digest of prediction_seal.json itself, "witnessed_at": the
                               publisher's time}

written once and never again (a restarted publisher reads it back from the site), and, when a webhook is
configured (`--webhook` or the run's `alerts.webhook_url`), POSTs the same with a line of text, so the digest also
sits in a chat channel's history. The run view holds the run's seal against this witness
(training/run_view.py): a seal that no longer matches it, or a prediction that no longer matches the seal, turns
the headline into a warning and draws no verdict against the band.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

from executor.store import storage
from executor.store.experiments import ExperimentStep
from executor.store.layout import PREDICTION_SEAL_FILE
from executor.watch.site.files import SiteWriter
from executor.watch.training import alerts
from executor.watch.training.panels import PanelError, step_config

logger = logging.getLogger(__name__)

SEAL = "seal.json"


def witness_text(witness: dict[str, Any]) -> str:
    return (f"prediction sealed for {witness['run']}: sha256 {witness['sha256']} (sealed by the run at "
            f"{witness['sealed_at']}, witnessed by the publisher at {witness['witnessed_at']})")  # fmt: skip


class SealWitness:
    """Witnesses each run's seal once (module docstring)."""

    def __init__(self, site: SiteWriter, webhook_url: str | None, clock: Callable[[], float]):
        self.site = site
        self.webhook_url = webhook_url
        self.clock = clock
        self._held: dict[str, dict[str, Any]] = {}
        """Witnesses written or read back, by site folder."""

    def witness(self, step: ExperimentStep, folder: str) -> dict[str, Any] | None:
        """The run's witness: the one the site holds, else, once the run has sealed, one written now (None
        before the run seals, or for a run that seals nothing)."""
        if folder in self._held:
            return self._held[folder]
        held = self.site.read_json(f"{folder}/{SEAL}")
        if isinstance(held, dict):
            self._held[folder] = held
            return held
        blob = storage.read_bytes(storage.join(step.output_path, PREDICTION_SEAL_FILE))
        try:
            seal = json.loads(blob) if blob is not None else None
        except ValueError:
            logger.warning("step %s: %s is not JSON; not witnessed", step.relative, PREDICTION_SEAL_FILE)
            return None
        if not isinstance(seal, dict) or not isinstance(seal.get("sha256"), str):
            return None
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC).isoformat(timespec="seconds")
        witness = {"run": step.relative, "sha256": seal["sha256"], "sealed_at": seal.get("sealed_at"),
                   "seal_sha256": hashlib.sha256(blob).hexdigest(), "witnessed_at": now}  # type: ignore[arg-type]  # fmt: skip
        self.site.write_once(f"{folder}/{SEAL}", json.dumps(witness, indent=1).encode())
        self._held[folder] = witness
        logger.info(witness_text(witness))
        hook = self._hook(step)
        if hook:
            alerts.post_json(
                hook, step.relative, {"text": witness_text(witness), "run": step.relative, "seal": witness}
            )
        return witness

    def _hook(self, step: ExperimentStep) -> str | None:
        try:
            configured = (step_config(step.output_path).get("alerts") or {}).get("webhook_url")
        except (PanelError, AttributeError):
            configured = None
        return configured if isinstance(configured, str) and configured else self.webhook_url
