"""Non-finite figures from the trainer's own writer to the viewer: recorded as "NaN" / "Infinity" / "-Infinity"
(not null), read back as what they were, marked on the charts, named in the header and alerted on, whichever
metric they are (support/nonfinite_dag.py writes them through the train step's tracker)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from nonfinite_dag import EVAL_NAN_STEP, GRAD_INF_STEP, ROUTER_STEP, build_nonfinite_prefix

from executor.store.layout import METRICS_FILE
from executor.store.metrics_log import metric_json, metric_number
from executor.watch.site.publish import SitePublisher
from executor.watch.training.alerts import AlertRules, evaluate
from steps.train.train_metrics import read_metrics


def test_the_encoding_round_trips() -> None:
    for value in (math.inf, -math.inf, 1.5, 0.0):
        assert metric_number(json.loads(json.dumps(metric_json(value)))) == value
    assert math.isnan(metric_number(json.loads(json.dumps(metric_json(math.nan)))))  # type: ignore[arg-type]
    assert [metric_number(text) for text in ("nan", "inf", "-inf")][1:] == [math.inf, -math.inf]
    assert metric_number(None) is None and metric_number("loss") is None and metric_number(True) is None


def test_the_trainers_nonfinite_figures_reach_the_published_run_view(tmp_path: Path) -> None:
    relative = build_nonfinite_prefix(tmp_path / "prefix")
    run = tmp_path / "prefix" / relative
    text = (run / METRICS_FILE).read_text()
    assert "null" not in text and '"grad/norm/total": "Infinity"' in text and '"eval/cell_a/loss": "NaN"' in text
    assert '"router/load/max_over_mean": "-Infinity"' in text
    json.loads(text.splitlines()[GRAD_INF_STEP])  # strict JSON: any parser reads it (no bare NaN token)

    fired = evaluate(read_metrics(str(run)), AlertRules(), now=0.0)
    assert [(alert.rule, alert.step) for alert in fired] == [
        ("nonfinite_grad", GRAD_INF_STEP),
        ("nonfinite_eval", EVAL_NAN_STEP),
        ("nonfinite_router", ROUTER_STEP),
    ]
    assert "eval/cell_a/loss = nan" in fired[1].message and "eval/macro_loss = nan" in fired[1].message

    SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site")).cycle()
    folder = tmp_path / "site" / "data" / "step" / relative
    view = json.loads((folder / "run.json").read_text())
    named = {entry["key"]: (entry["first"], entry["value"]) for entry in view["nonfinite"]}
    assert named == {"grad/norm/total": (GRAD_INF_STEP, "inf"), "eval/macro_loss": (EVAL_NAN_STEP, "nan"),
                     "eval/cell_a/loss": (EVAL_NAN_STEP, "nan"),
                     "router/load/max_over_mean": (ROUTER_STEP, "-inf")}  # fmt: skip
    charts = {chart["id"]: chart for chart in view["charts"]}
    assert {"step": GRAD_INF_STEP, "kind": "nonfinite", "label": "grad/norm/total inf"} in charts["grad_norm"][
        "markers"
    ]
    assert {"step": EVAL_NAN_STEP, "kind": "nonfinite", "label": "eval/macro_loss nan"} in charts["loss"]["markers"]
    assert any(marker["label"] == "eval/cell_a/loss nan" for marker in charts["eval_domains"]["markers"])
    assert view["last_eval"]["step"] == 30 and view["last_eval"]["value"] != "nan"
    grid = json.loads((folder / "metrics.json").read_text())
    assert grid["series"]["router/load/max_over_mean"]["nonfinite"] == [[ROUTER_STEP, "-inf"]]
    rules = [alert["rule"] for alert in json.loads((folder / "alerts.json").read_text())["alerts"]]
    assert rules == ["nonfinite_grad", "nonfinite_eval", "nonfinite_router"]
