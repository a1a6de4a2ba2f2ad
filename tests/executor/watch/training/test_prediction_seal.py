"""The prediction a run is watched against is sealed when the run starts: digest and time, kept across a
resume; the run view says when it was made, that this was before the first step, and whether it still holds
(tests/support/band_dag.py's hero seals as the train step does: steps/train/train.py calls the same function)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from band_dag import build_band_prefix

from executor.store.layout import PREDICTION_SEAL_FILE
from executor.watch.training.run_view import run_view
from steps.train.train_metrics import seal_prediction


def test_the_seal_is_shown_kept_across_a_resume_and_broken_by_an_edit(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    paths = build_band_prefix(prefix, long_steps=10)
    hero, ladder = prefix / paths["train/hero"], prefix / paths["scaling/ladder"]
    seal = json.loads((hero / PREDICTION_SEAL_FILE).read_text())
    assert seal["sha256"] == hashlib.sha256((ladder / "prediction.json").read_bytes()).hexdigest()
    shown = run_view(str(prefix), str(hero))["sealed"]
    assert shown["sha256"] == seal["sha256"] and shown["before_first_step"] is True and shown["matches"] is True
    assert shown["predicted_at"] < shown["first_step_at"]

    seal_prediction(str(hero), str(ladder))  # a resumed attempt: the first seal stands
    assert json.loads((hero / PREDICTION_SEAL_FILE).read_text()) == seal
    edited = json.loads((ladder / "prediction.json").read_text())
    edited["prediction"]["high"] += 1.0  # the band widened after the run started
    (ladder / "prediction.json").write_text(json.dumps(edited))
    assert run_view(str(prefix), str(hero))["sealed"]["matches"] is False
