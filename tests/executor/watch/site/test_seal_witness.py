"""The seal witnessed outside the run (site/seal_witness.py): the publisher writes the site's own seal.json the
first cycle it sees the run's seal, POSTs its digest to the webhook, and the run view holds the seal against it:
an edited prediction, or a seal rewritten together with it, takes the verdict off the headline."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from band_dag import build_band_prefix
from test_alerts import Hook, webhook  # noqa: F401 (a fixture)

from executor.store.layout import PREDICTION_SEAL_FILE
from executor.watch.site.publish import SitePublisher


def run_json(site: Path, relative: str, name: str = "run.json") -> dict:
    return json.loads((site / "data/step" / relative / name).read_text())


def test_the_seal_is_witnessed_once_and_a_rewrite_loses_the_verdict(tmp_path: Path, webhook: str) -> None:  # noqa: F811
    prefix, site = tmp_path / "prefix", tmp_path / "site"
    paths = build_band_prefix(prefix, long_steps=10)
    hero, ladder = prefix / paths["train/hero"], prefix / paths["scaling/ladder"]
    clock = iter(range(1_800_000_000, 1_900_000_000, 60))
    publisher = SitePublisher(str(prefix), str(site), webhook_url=webhook, clock=lambda: float(next(clock)))
    publisher.cycle()
    seal = json.loads((hero / PREDICTION_SEAL_FILE).read_text())
    witness_file = site / "data/step" / paths["train/hero"] / "seal.json"
    witness = json.loads(witness_file.read_text())
    assert witness["sha256"] == seal["sha256"] == hashlib.sha256((ladder / "prediction.json").read_bytes()).hexdigest()
    assert witness["seal_sha256"] == hashlib.sha256((hero / PREDICTION_SEAL_FILE).read_bytes()).hexdigest()
    assert witness["witnessed_at"].startswith("2027-01-15")  # the publisher's clock, not the run's
    [posted] = [message for message in Hook.received if "seal" in message]
    assert posted["seal"] == witness and seal["sha256"] in posted["text"]
    view = run_json(site, paths["train/hero"])
    assert view["seal_warning"] is None and view["sealed"]["witnessed"] is True
    assert view["last_eval"]["verdict"] == "inside"
    ladder_view = run_json(site, paths["scaling/ladder"], "ladder.json")
    assert ladder_view["sealed_by"] == {paths["train/hero"]: seal["sha256"]} and ladder_view["seal_warning"] is None

    edited = json.loads((ladder / "prediction.json").read_text())  # the band widened after the run started
    edited["prediction"]["high"] += 1.0
    (ladder / "prediction.json").write_text(json.dumps(edited))
    publisher.cycle()
    view = run_json(site, paths["train/hero"])
    assert view["last_eval"]["verdict"] is None and "prediction.json changed" in view["seal_warning"]
    ladder_view = run_json(site, paths["scaling/ladder"], "ladder.json")  # the ladder page draws no verdict either
    assert ladder_view["seal_warning"].startswith(f"prediction.json changed after {paths['train/hero']} sealed it")

    # The seal rewritten to match the edited prediction: only the witness tells.
    new_digest = hashlib.sha256((ladder / "prediction.json").read_bytes()).hexdigest()
    (hero / PREDICTION_SEAL_FILE).write_text(json.dumps({**seal, "sha256": new_digest, "sealed_at": "2026-01-01"}))
    publisher.cycle()
    fresh = SitePublisher(str(prefix), str(site), clock=lambda: 1.9e9)  # a restarted publisher reads the witness
    fresh.cycle()
    assert json.loads(witness_file.read_text()) == witness  # never rewritten
    view = run_json(site, paths["train/hero"])
    assert view["sealed"]["matches"] is True and view["sealed"]["witnessed"] is False
    assert view["last_eval"]["verdict"] is None and "not the one the publisher witnessed" in view["seal_warning"]
    ladder_view = run_json(site, paths["scaling/ladder"], "ladder.json")  # the run's seal matches: the witness tells
    assert f"{paths['train/hero']} (witnessed)" in ladder_view["seal_warning"]
    assert len([message for message in Hook.received if "seal" in message]) == 1
