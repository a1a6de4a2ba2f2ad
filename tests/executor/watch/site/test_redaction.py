"""Nothing private reaches the published site, wherever it was planted (docs/watching.md, "What is published, exactly").

A real run step (executor, local prefix) carries each kind of secret in its config, in its metrics lines, in a
status event's details and in its alerts; the site is published and every byte of every published file is
searched for each planted value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from publish_dag import metrics_line

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep
from executor.store.events import StatusEvent, StepStatus, append_event
from executor.store.layout import ALERTS_FILE, METRICS_FILE
from executor.watch.site.publish import SitePublisher
from executor.watch.site.redaction import Redactor, secret_key

WEBHOOK = "https://hooks.example.org/services/T0PLANTED/B0PLANTED/hookPLANTED"
URL_WITH_PASSWORD = "https://alice:pw-PLANTED@data.example.org/corpus?sig=sigPLANTED"
OTHER_BUCKET = "gs://other-bucket-PLANTED/checkpoints/step-100"
HOST = "secret-host-PLANTED"
PID = "73519"
IP = "10.213.7.99"
TOKEN_SHAPED = "ghp_PLANTEDPLANTEDPLANTED1234"

PLANTED = {
    "webhook": WEBHOOK,
    "webhook's secret path": "hookPLANTED",
    "password in a URL": "pw-PLANTED",
    "query token": "sigPLANTED",
    "another bucket": "other-bucket-PLANTED",
    "host name": HOST,
    "host:pid": f":{PID}",
    "ip": IP,
    "token-shaped string": TOKEN_SHAPED,
    "_key value": "keyPLANTED",
    "password value": "passwordPLANTED",
    "credential value": "credentialPLANTED",
    "camelCase token value": "hfTokenPLANTED",
    "path outside the prefix": "/home/someone/PLANTED-private",
}


@dataclass(frozen=True)
class LeakyRunConfig:
    """A run whose plain config holds every kind of secret a user might put there."""

    output_path: str
    alerts: dict[str, Any] = field(default_factory=lambda: {"webhook_url": WEBHOOK})
    data_url: str = URL_WITH_PASSWORD
    resume_from: str = OTHER_BUCKET
    signing_key: str = "keyPLANTED"
    hub_password: str = "passwordPLANTED"
    gcp_credentials: str = "credentialPLANTED"
    hfToken: str = "hfTokenPLANTED"  # noqa: N815 (a user's own spelling)
    scratch: str = "/home/someone/PLANTED-private/scratch"


def leaky_run(config: LeakyRunConfig) -> None:
    lines = [metrics_line(step) for step in range(40)]
    lines[5] |= {"api_key": "keyPLANTED", "note": f"from {HOST}:{PID} at {IP}", "source": URL_WITH_PASSWORD}
    lines[6] |= {"host": HOST, "pid": int(PID), "worker": f"{HOST}:{PID}", "upload": OTHER_BUCKET}
    lines[7] |= {"comment": f"token {TOKEN_SHAPED} for /home/someone/PLANTED-private/x"}
    Path(config.output_path, METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))


def plant_status_and_alerts(output_path: str) -> None:
    details = {"host": HOST, "ip": IP, "holder": f"{HOST}:{PID}", "message": f"lost {HOST} ({IP}), pid {PID}",
               "checkpoint": OTHER_BUCKET, "hook": WEBHOOK}  # fmt: skip
    append_event(output_path, StatusEvent(StepStatus.SUCCESS, worker=f"{HOST}:{PID}", message=WEBHOOK, details=details))
    alert = {"rule": "loss_spike", "step": 5, "value": 9.0, "threshold": 4.0, "time": 1.0,
             "message": f"spike on {HOST}:{PID}; see {URL_WITH_PASSWORD}; {TOKEN_SHAPED}"}  # fmt: skip
    Path(output_path, ALERTS_FILE).write_text(json.dumps(alert) + "\n")


def test_no_planted_secret_reaches_any_published_byte(tmp_path: Path) -> None:
    step = ExecutorStep(name="train/leaky", fn=leaky_run, config=LeakyRunConfig(output_path=THIS_OUTPUT_PATH))
    executor = Executor(str(tmp_path / "prefix"))
    executor.run([step], caller="experiments/leaky.py", description=f"debugging on {HOST}:{PID}")
    output_path = executor.output_paths[step]
    plant_status_and_alerts(output_path)
    site = tmp_path / "site"
    SitePublisher(str(tmp_path / "prefix"), str(site)).cycle()

    published = {path: path.read_bytes() for path in site.rglob("*") if path.is_file()}
    assert len(published) > 20
    leaks = [(kind, str(path.relative_to(site))) for kind, value in PLANTED.items()
             for path, data in published.items() if value.encode() in data]  # fmt: skip
    assert not leaks, leaks
    relative = Path(output_path).relative_to(tmp_path / "prefix").as_posix()
    config = json.loads(published[site / f"data/step/{relative}/step.json"])["config"]
    rows = {row["key"]: row["value"] for row in config}
    assert rows["alerts.webhook_url"] == rows["signing_key"] == rows["hfToken"] == "<redacted>"
    assert rows["data_url"] == "https://<redacted>" and rows["resume_from"] == "gs://<redacted>"
    assert rows["scratch"] == "…/scratch"  # what is not private stays readable
    alerts = json.loads(published[site / f"data/step/{relative}/alerts.json"])["alerts"]
    # the planted host is named "secret-...": its "name:pid" reads as a credential, hidden whole
    assert alerts[0]["message"].startswith("spike on <redacted>:<redacted>; see https://<redacted>")


def test_secret_words_are_words_not_substrings() -> None:
    for name in ("api_key", "alerts.webhook_url", "hfToken", "HF_TOKEN", "aws_secret_access_key", "db-password"):
        assert secret_key(name), name
    for name in ("key", "keys", "max_tokens", "tokenizer", "data/tokens/topic01_q1", "monkey", "train/loss", "turkey"):
        assert not secret_key(name), name
    redactor = Redactor("/runs")
    assert redactor.text("at 2026-12-03T06:44:22.94 step 30: nan") == "at 2026-12-03T06:44:22.94 step 30: nan"
    assert redactor.text("/runs/train/a-1/metrics.jsonl") == "<prefix>/train/a-1/metrics.jsonl"
