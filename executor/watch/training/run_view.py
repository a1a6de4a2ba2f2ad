"""The run view of a step whose metrics.jsonl holds train/loss: the one place that decides what it draws.

The live dashboard answers `/api/step/run` with `run_view(...)`, and the publisher writes the same answer,
redacted, as the site's `data/step/<R>/run.json`: both pages draw this JSON and nothing else, so the metric on
the loss chart, the band beside it and the points drawn cannot differ between them.

- The eval line is the metric the ladder predicts: `eval/suite/macro_loss` where the run logs it, else
  Levanter's `eval/macro_loss` (metrics_log.predicted_metric), else the mean of the components' losses, else
  `eval/loss`; the chart's series is labelled with that key, and the header says where the last eval point sits
  against the band at its step (`last_eval.verdict`: inside, above, below).
- Long series keep their extremes (series.py: each bucket's min and max, every alert's step), NaN and infinite
  points are listed on the chart (`markers`, drawn as marks at the top) and named in the header (`nonfinite`),
  and the header's last step is the last step logged, finite or not.
- Alerts (`alerts.jsonl`) are marked on the chart their rule reads.
- Its incidents (incidents.py): a timeline of attempts, failures, retries, takeovers, resumes, alerts, a
  fork's start and code drift (against the code the newest experiment holding the run planned), and its goodput.
- The prediction the run sealed when it started (`sealed`): its digest, when it was made, whether that was
  before the run's first step, whether prediction.json still has that digest, and, on the public site, whether
  the seal is still the one the publisher witnessed (site/seal_witness.py). When either no longer holds, the
  band it would be judged against is not the one registered: the header draws no verdict and says why
  (`seal_warning`, `last_eval.verdict` None).
- The optimizer and its mask (`optimizer`, the train step's optimizer_groups.json): each group's parameter count
  and which group every parameter is in.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import math
from collections.abc import Mapping
from typing import Any

from executor.store import storage
from executor.store.events import StatusEvent, read_events
from executor.store.layout import (
    INFO_FILE,
    METRICS_FILE,
    MIXTURE_FILE,
    OPTIMIZER_GROUPS_FILE,
    PREDICTION_FILE,
    PREDICTION_SEAL_FILE,
)
from executor.store.metrics_log import rows_by_step
from executor.watch import files
from executor.watch.incidents import CodeNow, code_drift, run_incidents
from executor.watch.series import RUN_BUCKETS, by_key, downsample, json_number, nonfinite
from executor.watch.training.alerts import AlertRules, read_alerts
from executor.watch.training.metric_names import TRAIN_LOSS, predicted_metric
from executor.watch.training.panels import (
    PanelError,
    chart,
    config_path,
    eval_components,
    macro_eval,
    parent_curve,
    predicted_curve,
    read_json,
)
from executor.watch.training.served_mixture import drifted, served_by_phase

RUN_CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # AdamW logs one rate; the hero's recipe one per group (steps/train/optimizer.py)
    ("learning_rate", "learning rate", ("optim/learning_rate", "optim/muonh_lr", "optim/adamh_lr", "optim/adam_lr")),
    ("grad_norm", "gradient norm", ("grad/norm/total",)),
    ("param_norm", "parameter norm", ("params/norm/total",)),
    ("router_bias", "router bias norm (not trained by gradients)", ("router/bias/norm",)),
    ("expert_load", "expert load", ("router/load/max_over_min", "router/load/max_over_mean")),
    ("throughput", "throughput (tokens/s)", ("throughput/tokens_per_second",)),
    ("mfu", "MFU", ("mfu",)),
)
"""The run view's charts after the loss, each (id, title, metric keys); a key with no data draws no line, a chart with
none is left out."""
ALERT_CHARTS = {"grad_spike": "grad_norm", "throughput_drop": "throughput", "expert_imbalance": "expert_load",
                "nonfinite_grad": "grad_norm", "nonfinite_router": "expert_load", "nonfinite_metric": None}  # fmt: skip
"""The chart an alert rule's marker goes on (None: none, the non-finite points are marked where they are drawn);
every other rule reads the loss."""

Rows = Mapping[int, Mapping[str, Any]]
Columns = dict[str, dict[int, float]]


def eval_line(rows: Rows, columns: Columns) -> tuple[str, dict[int, float]]:
    """The eval metric drawn against the band (module docstring) and its values by step, NaN included."""
    key = predicted_metric({0: columns})
    if key in columns:
        return key, columns[key]
    if not any(name.startswith("eval/") for name in columns):
        return "eval/loss", {}
    components = eval_components({0: columns})
    values = {step: loss for step, row in rows.items() if (loss := macro_eval(row, components)) is not None}
    return ("eval (mean over components)" if components else "eval/loss"), values


def band_at(curve: list[dict[str, float]], step: int) -> dict[str, float] | None:
    """The predicted band at `step`, linearly between curve points; None outside the curve."""
    points = sorted(curve, key=lambda point: point["step"])
    for left, right in itertools.pairwise(points):
        if left["step"] <= step <= right["step"]:
            share = (step - left["step"]) / ((right["step"] - left["step"]) or 1)
            return {edge: left[edge] + share * (right[edge] - left[edge]) for edge in ("loss", "low", "high")}
    if points and points[-1]["step"] == step:
        return {edge: points[-1][edge] for edge in ("loss", "low", "high")}
    return None


def last_eval(
    label: str, values: dict[int, float], curve: list[dict[str, float]], warning: str | None = None
) -> dict[str, Any] | None:
    """The header's last eval point and its verdict against the band (none while `warning` says the band is not
    the one the run sealed)."""
    if not values:
        return None
    step = max(values)
    value, band = values[step], band_at(curve, step)
    verdict = None
    if band is not None and math.isfinite(value) and warning is None:
        verdict = "below" if value < band["low"] else "above" if value > band["high"] else "inside"
    return {"key": label, "step": step, "value": json_number(value), "band": band, "verdict": verdict}


def drawn(values: dict[int, float], keep: set[int]) -> dict[int, float]:
    return downsample(values, RUN_BUCKETS, keep)


def marked(spec: dict[str, Any], chart_id: str, lines: list[tuple[str, dict[int, float]]], alerts: list[Any]) -> dict:
    """The chart with its markers: each non-finite point of its series, and the alerts of its rules."""
    markers = [{"step": step, "kind": "nonfinite", "label": f"{label} {value}"}
               for label, values in lines for step, value in nonfinite(values)]  # fmt: skip
    markers += [{"step": alert.get("step"), "kind": "alert", "label": alert.get("rule")} for alert in alerts
                if ALERT_CHARTS.get(str(alert.get("rule")), "loss") == chart_id]  # fmt: skip
    steps = {marker["step"] for marker in markers if isinstance(marker["step"], int)} - set(spec["x"])
    if steps:  # the x axis reaches every marker (a run that ends NaN ends past its last drawable point)
        xs = sorted({*spec["x"], *steps})
        for entry in spec["series"]:
            by_x = dict(zip(spec["x"], entry["values"], strict=True))
            entry["values"] = [by_x.get(x) for x in xs]
        spec["x"] = xs
    return {**spec, "markers": markers}


def loss_chart(
    columns: Columns,
    eval_points: tuple[str, dict[int, float]],
    curve: list[dict[str, float]],
    parent: dict[int, float],
    alerts: list[Any],
) -> dict:
    keep = {alert["step"] for alert in alerts if isinstance(alert.get("step"), int)}
    train = columns[TRAIN_LOSS]
    label, evals = eval_points
    series: list[dict[str, Any]] = [{"label": TRAIN_LOSS, "kind": "line", "points": drawn(train, keep)}]
    if evals:
        series.append({"label": label, "kind": "points", "points": drawn(evals, keep)})
    if parent:
        series.append({"label": f"parent {TRAIN_LOSS}", "kind": "line", "points": drawn(parent, set())})
    for name, kind, key in (("predicted", "dashed", "loss"), ("predicted low", "band_low", "low"),
                            ("predicted high", "band_high", "high")):  # fmt: skip
        if curve:
            series.append({"label": name, "kind": kind, "points": {point["step"]: point[key] for point in curve}})
    spec = chart("loss", "loss", series, x_label="step")
    return marked(spec, "loss", [(TRAIN_LOSS, train), (label, evals)], alerts)


def metric_charts(columns: Columns, alerts: list[Any], parent: Columns) -> list[dict[str, Any]]:
    """The run's other charts; a fork's parent's figures, up to the fork, beside its own on each."""
    keep = {alert["step"] for alert in alerts if isinstance(alert.get("step"), int)}
    charts = []
    for chart_id, title, keys in RUN_CHARTS:
        values = {key: columns.get(key, {}) for key in keys}
        series = [{"label": key, "kind": "line", "points": drawn(values[key], keep)} for key in keys if values[key]]
        series += [{"label": f"parent {key}", "kind": "line", "points": drawn(parent[key], set())}
                   for key in keys if parent.get(key) and values[key]]  # fmt: skip
        if any(values.values()):
            spec = chart(chart_id, title, series, x_label="step")
            charts.append(marked(spec, chart_id, list(values.items()), alerts))
    for chart_id, title, under in (("eval_domains", "eval loss per domain", "eval/"),
                                   ("eval_suite", "eval loss per suite subset", "eval/suite/")):  # fmt: skip
        per_part = [{"label": name, "kind": "points", "points": drawn(columns[f"{under}{name}/loss"], keep)}
                    for name in eval_components({0: columns}, under)]  # fmt: skip
        if per_part:
            lines = [
                (f"{under}{name}/loss", columns[f"{under}{name}/loss"]) for name in eval_components({0: columns}, under)
            ]
            charts.append(marked(chart(chart_id, title, per_part, x_label="step"), chart_id, lines, []))
    return charts


def header_nonfinite(columns: Columns, keys: list[str]) -> list[dict[str, Any]]:
    """Per key with non-finite points, `keys` first, then every other key in order: how many, the first and the
    last (what the header names)."""
    named = []
    for key in dict.fromkeys([*keys, *sorted(columns)]):
        bad = nonfinite(columns.get(key, {}))
        if bad:
            named.append({"key": key, "count": len(bad), "first": bad[0][0], "last": bad[-1][0], "value": bad[-1][1]})
    return named


def sealed_prediction(
    prefix: str, output_path: str, rows: Rows, witness: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The prediction the run sealed when it started (steps/train/train_metrics.py): its digest and times, the
    time of the run's first step, whether prediction.json still has that digest, and the publisher's witness of
    the seal (site/seal_witness.py) with whether the seal still matches it (None: no witness)."""
    seal = read_json(storage.join(output_path, PREDICTION_SEAL_FILE), PREDICTION_SEAL_FILE)
    if not isinstance(seal, dict) or not isinstance(seal.get("sha256"), str):
        return None
    try:
        path = config_path(prefix, output_path, "prediction_path", PREDICTION_FILE)
        current = storage.read_bytes(path) if path else None
    except PanelError:
        current = None
    timed = [step for step, row in rows.items() if files.number(row.get("time")) is not None]
    first = files.number(rows[min(timed)].get("time")) if timed else None
    first_at = dt.datetime.fromtimestamp(first, dt.UTC).isoformat() if first is not None else None
    predicted_at = seal.get("predicted_at")
    before = None
    if isinstance(predicted_at, str) and first_at is not None:
        before = dt.datetime.fromisoformat(predicted_at) < dt.datetime.fromisoformat(first_at)
    return {"sha256": seal["sha256"], "predicted_at": predicted_at, "sealed_at": seal.get("sealed_at"),
            "first_step_at": first_at, "before_first_step": before,
            "matches": None if current is None else hashlib.sha256(current).hexdigest() == seal["sha256"],
            "witness": dict(witness) if witness else None,
            "witnessed": None if not witness else (witness.get("sha256"), witness.get("sealed_at")) ==
                         (seal["sha256"], seal.get("sealed_at"))}  # fmt: skip


def seal_warning(sealed: Mapping[str, Any] | None) -> str | None:
    """Why the band may not be the one the run registered (None: nothing says so)."""
    if sealed is None:
        return None
    if sealed.get("witnessed") is False:
        witness = sealed["witness"]
        return (
            f"the run's seal is not the one the publisher witnessed at {witness.get('witnessed_at')} (digest "
            f"{str(witness.get('sha256'))[:16]}): the seal was rewritten; no verdict against the band"
        )
    if sealed.get("matches") is False:
        return (
            f"prediction.json changed after the run sealed it (digest {sealed['sha256'][:16]}): the band is not "
            "the one registered; no verdict against it"
        )
    return None


def served_mixture(output_path: str, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Planned against served, per phase and component (served_mixture.py), for a run with mixture.json."""
    mixture = read_json(storage.join(output_path, MIXTURE_FILE), MIXTURE_FILE)
    served = served_by_phase(records, mixture) if isinstance(mixture, dict) else None
    if served is not None:
        rules = AlertRules()
        served["drifted"] = drifted(served, rules.mixture_drift, rules.mixture_drift_min_blocks)
    return served


def optimizer_mask(output_path: str) -> dict[str, Any] | None:
    """The run's optimizer, each group's parameter count and the group of every parameter (optimizer_groups.json),
    as [parameter, group] rows: a parameter's path is data, not a key (the site's redaction reads a key named like
    `token_embeddings` as a secret's)."""
    record = read_json(storage.join(output_path, OPTIMIZER_GROUPS_FILE), OPTIMIZER_GROUPS_FILE)
    if not isinstance(record, dict) or not isinstance(record.get("groups"), dict):
        return None
    parameters = record.get("parameters") or {}
    rows = [[str(path), str(group)] for path, group in record["groups"].items()]
    return {"optimizer": record.get("optimizer"), "parameters": parameters, "groups": rows}


def run_drift(output_path: str, events: list[StatusEvent], now: CodeNow | None) -> dict[str, Any] | None:
    """The run's code drift incident (incidents.code_drift); its `.executor_info` is read only when it drifted."""
    if code_drift("", events, None, now) is None:
        return None
    info = storage.read_json(storage.join(output_path, INFO_FILE)) or {}
    return code_drift(str(info.get("name") or storage.basename(output_path)), events, info, now)


def run_view(
    prefix: str,
    output_path: str,
    records: list[dict[str, Any]] | None = None,
    now: CodeNow | None = None,
    witness: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What the run view draws (module docstring); `records`: the run's metrics lines when already read; `now`:
    the run's code as the newest experiment holding it planned it (for code drift); `witness`: the publisher's
    witness of the run's seal (site/seal_witness.py)."""
    if records is None:
        records = files.metrics_records(storage.join(output_path, METRICS_FILE)) or []
    rows = rows_by_step(records)
    columns = by_key(rows)
    train = columns.get(TRAIN_LOSS)
    if not train:
        raise PanelError(f"{storage.join(output_path, METRICS_FILE)} has no {TRAIN_LOSS} rows (yet): no run to show")
    curve, prediction_source, prediction_error = predicted_curve(prefix, output_path)
    parent_rows, lineage = parent_curve(prefix, output_path)
    parent = by_key(parent_rows)
    alerts = read_alerts(output_path)
    label, evals = eval_line(rows, columns)
    charts = [
        loss_chart(columns, (label, evals), curve, parent.get(TRAIN_LOSS, {}), alerts),
        *metric_charts(columns, alerts, parent),
    ]
    events = read_events(output_path)
    last_step = max(train)
    chart_keys = [key for _, _, keys in RUN_CHARTS for key in keys]
    sealed = sealed_prediction(prefix, output_path, rows, witness)
    warning = seal_warning(sealed)
    return {
        "steps": len(rows),
        "last_step": last_step,
        "last_train_loss": json_number(train[last_step]),
        "last_eval": last_eval(label, evals, curve, warning),
        "seal_warning": warning,
        "nonfinite": header_nonfinite(columns, [TRAIN_LOSS, label, *chart_keys]),
        "components": eval_components({0: columns}),
        "prediction": {"source": prediction_source, "points": len(curve)} if curve else None,
        "prediction_error": prediction_error,
        "thinned": len(train) > 2 * RUN_BUCKETS,
        "buckets": RUN_BUCKETS,
        "alerts": alerts,
        "lineage": lineage,
        "sealed": sealed,
        "mixture": served_mixture(output_path, records),
        "optimizer": optimizer_mask(output_path),
        "incidents": run_incidents(events, records, alerts, lineage, run_drift(output_path, events, now)),
        "charts": charts,
    }
