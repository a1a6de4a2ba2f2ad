"""The ladder view of a scaling step (a step whose output holds `prediction.json`).

prediction.json, as the scaling step writes it:

    {"fit": {"A", "alpha", "asymptote", "rms_log_residual"},
     "prediction": {"compute", "loss", "low", "high"},
     "rungs": [{"name", "compute", "final_loss", "tokens", "curve": [{"tokens", "loss"}]}],
     "curve": [{"tokens", "step", "loss", "low", "high"}],
     "target": {"name", "compute", "tokens", "tokens_per_step"},
     "warnings": ["why the prediction deserves less trust than its band says", ...]}

The view draws loss against compute (log x): the rungs' final losses, the law L = E + A * C^-alpha from the
smallest rung out past the target, the prediction with its band, and the achieved loss once the target has
been evaluated. The achieved loss is the `macro_loss` of a `results.json` downstream of the scaling step in
the experiment's graph (the target's train step depends on the scaling step, its evaluate step on the train
step), found within `ACHIEVED_DEPTH` edges, never by step names.

The runs downstream that sealed this prediction when they started (`prediction_seal.json`) hold it to its digest:
when prediction.json no longer has the digest a run sealed (or, on the public site, the one the publisher
witnessed: site/seal_witness.py), the band is not the one registered, and `seal_warning` says so: the page then
draws no "inside the band" verdict for the achieved loss.

Beside it, the overlay of the runs: the rungs' eval curves, the predicted curve and the target run's eval points
against tokens (`compare`) and against training FLOPs (`compare_flops`: tokens times the run's FLOPs per token,
its recorded `compute` over its `tokens`); the page toggles between the two.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from executor.store import storage
from executor.store.experiments import Experiment
from executor.store.layout import METRICS_FILE, PREDICTION_FILE, PREDICTION_SEAL_FILE, RESULTS_FILE, relative_to
from executor.store.metrics_log import rows_by_step
from executor.watch import files
from executor.watch.training.metric_names import predicted_metric
from executor.watch.training.panels import PanelError, chart, numbers, read_json

ACHIEVED_DEPTH = 2
MAX_DOWNSTREAM = 64
LAW_POINTS = 60


def check_prediction(document: Any, path: str) -> dict[str, Any]:
    """The figures the view needs from prediction.json, each checked to be there and finite."""
    where = path
    if not isinstance(document, dict):
        raise PanelError(f"{where} holds {type(document).__name__}, not the scaling step's object")
    fit = numbers(document.get("fit"), ("A", "alpha", "asymptote"), f"{where} 'fit'")
    prediction = numbers(document.get("prediction"), ("compute", "loss", "low", "high"), f"{where} 'prediction'")
    rungs = document.get("rungs")
    if not isinstance(rungs, list) or not rungs:
        raise PanelError(f"{where} has no 'rungs' list; rerun the scaling step")
    checked = []
    for number, rung in enumerate(rungs):
        figures = numbers(rung, ("compute", "final_loss"), f"{where} rungs[{number}]")
        if figures["compute"] <= 0:
            raise PanelError(f"{where} rungs[{number}] has compute {figures['compute']}, not a positive number")
        checked.append({"name": str(rung.get("name", f"rung {number}")), **figures,
                        "tokens": rung.get("tokens")})  # fmt: skip
    target = document.get("target") if isinstance(document.get("target"), dict) else {}
    return {"fit": fit | {"rms_log_residual": (document["fit"] or {}).get("rms_log_residual")},
            "prediction": prediction, "rungs": checked, "target": target,
            "curve_points": len(document.get("curve") or [])}  # fmt: skip


def law(fit: dict[str, float], compute: float) -> float:
    return fit["asymptote"] + fit["A"] * compute ** -fit["alpha"]


def achieved_loss(prefix: str, experiment: Experiment | None, relative: str) -> dict[str, Any] | None:
    """The first `results.json` with a `macro_loss` among the steps within ACHIEVED_DEPTH edges downstream."""
    step = experiment.by_relative.get(relative) if experiment else None
    if experiment is None or step is None:
        return None
    children: dict[int, list[int]] = {}
    for other in experiment.steps:
        for dependency in other.dependencies:
            if dependency.index is not None:
                children.setdefault(dependency.index, []).append(other.index)
    frontier, downstream = [step.index], []
    for _ in range(ACHIEVED_DEPTH):
        frontier = [child for index in frontier for child in children.get(index, [])]
        downstream += frontier
    candidates = [experiment.steps[index] for index in dict.fromkeys(downstream)][:MAX_DOWNSTREAM]
    blobs = storage.read_many(storage.join(candidate.output_path, RESULTS_FILE) for candidate in candidates)
    for candidate, blob in zip(candidates, blobs, strict=True):
        if blob is None:
            continue
        try:
            loss = numbers(json.loads(blob), ("macro_loss",), RESULTS_FILE)["macro_loss"]
        except (ValueError, PanelError):
            continue  # a results.json of another shape (or cut off) is not the achieved loss
        return {"loss": loss, "name": candidate.name, "path": relative_to(prefix, candidate.output_path)}
    return None


def downstream_runs(experiment: Experiment | None, relative: str) -> list[Any]:
    """The steps that depend on the scaling step directly (the target's train step)."""
    step = experiment.by_relative.get(relative) if experiment else None
    if experiment is None or step is None:
        return []
    return [other for other in experiment.steps if any(dep.index == step.index for dep in other.dependencies)]


def flops_per_token(figures: Any) -> float | None:
    """A run's training FLOPs per token as the scaling step recorded it: its `compute` (the one calculator's
    `training_flops(shape, tokens)`, steps/model/model_size.py, linear in tokens) over its `tokens`. None when
    either is missing or not positive."""
    compute = files.number((figures or {}).get("compute"))
    tokens = files.number((figures or {}).get("tokens"))
    return compute / tokens if compute and tokens and compute > 0 and tokens > 0 else None


def compare_series(document: dict[str, Any], experiment: Experiment | None, relative: str) -> list[dict[str, Any]]:
    """The rungs' eval curves, the predicted curve and the target run's eval points, each against tokens, with the
    FLOPs per token that puts it on a FLOPs axis (the rung's own; the target's for the prediction and the run)."""
    target = document.get("target") or {}
    target_flops = flops_per_token(target)
    series: list[dict[str, Any]] = []
    for rung in document.get("rungs") or []:
        points = {float(point["tokens"]): float(point["loss"]) for point in rung.get("curve") or []
                  if files.number(point.get("tokens")) and files.number(point.get("loss")) is not None}  # fmt: skip
        if points:
            series.append({"label": str(rung.get("name")), "kind": "line", "points": points,
                           "flops_per_token": flops_per_token(rung)})  # fmt: skip
    curve = document.get("curve") or []
    predicted = {float(point["tokens"]): float(point["loss"]) for point in curve
                 if files.number(point.get("tokens")) and files.number(point.get("loss")) is not None}  # fmt: skip
    if predicted:
        series.append({"label": "predicted", "kind": "dashed", "points": predicted, "flops_per_token": target_flops})
    per_step = files.number(target.get("tokens_per_step")) or 0.0
    for run in downstream_runs(experiment, relative) if per_step > 0 else []:
        rows = rows_by_step(files.metrics_records(storage.join(run.output_path, METRICS_FILE)) or [])
        metric = predicted_metric(rows)
        points = {(step + 1) * per_step: value for step, row in rows.items()
                  if (value := files.number(row.get(metric))) is not None}  # fmt: skip
        if points:
            series.append({"label": f"{run.name} ({metric})", "kind": "points", "points": points,
                           "flops_per_token": target_flops})  # fmt: skip
    return series


def compare_chart(document: dict[str, Any], experiment: Experiment | None, relative: str) -> dict[str, Any]:
    """The rungs' and the target's eval loss against tokens on one chart (log x), the predicted curve between:
    how the hero runs against the runs that predicted it."""
    series = compare_series(document, experiment, relative)
    return chart("compare", "rungs and target: eval loss vs tokens", series, x_label="tokens", log_x=True)


def compare_flops_chart(document: dict[str, Any], experiment: Experiment | None, relative: str) -> dict[str, Any]:
    """The same runs against training FLOPs (log x): each point's tokens times its run's FLOPs per token, so a
    rung and the target meet where they spent the same compute. A run whose FLOPs per token prediction.json
    cannot give (no `tokens` beside its `compute`) is left out and named in `missing`."""
    series, missing = [], []
    for one in compare_series(document, experiment, relative):
        per_token = one.pop("flops_per_token")
        if per_token is None:
            missing.append(one["label"])
            continue
        series.append(one | {"points": {tokens * per_token: loss for tokens, loss in one["points"].items()}})
    flops = chart("compare_flops", "rungs and target: eval loss vs training FLOPs", series,
                  x_label="training FLOPs", log_x=True)  # fmt: skip
    return flops | {"missing": missing}


def broken_seals(digest: str, sealed: Mapping[str, Any]) -> str | None:
    """Why the band is not the registered one: a run (by relative path) sealed, or was witnessed sealing, another
    digest than prediction.json's `digest` now (None: every seal holds)."""
    broken = sorted(run for run, sealed_digest in sealed.items() if sealed_digest != digest)
    if not broken:
        return None
    return (f"prediction.json changed after {', '.join(broken)} sealed it (digest now {digest[:16]}): the band is not "
            "the one registered; no verdict against it")  # fmt: skip


def run_seals(prefix: str, experiment: Experiment | None, relative: str) -> dict[str, str]:
    """The digest each run downstream sealed (those that sealed one), by relative path."""
    runs = downstream_runs(experiment, relative)
    blobs = storage.read_many(storage.join(run.output_path, PREDICTION_SEAL_FILE) for run in runs)
    seals = {}
    for run, blob in zip(runs, blobs, strict=True):
        try:
            seal = json.loads(blob) if blob else None
        except ValueError:
            continue
        if isinstance(seal, dict) and isinstance(seal.get("sha256"), str):
            seals[relative_to(prefix, run.output_path) or run.relative] = seal["sha256"]
    return seals


def ladder_view(prefix: str, output_path: str, relative: str, experiment: Experiment | None) -> dict[str, Any]:
    path = storage.join(output_path, PREDICTION_FILE)
    document = read_json(path, "ladder view")
    if document is None:
        raise PanelError(f"ladder view: no {path}; the scaling step has not written its prediction (yet)")
    figures = check_prediction(document, path)
    fit, prediction = figures["fit"], figures["prediction"]
    rungs = [rung | {"fitted": law(fit, rung["compute"]), "residual": rung["final_loss"] - law(fit, rung["compute"])}
             for rung in figures["rungs"]]  # fmt: skip
    achieved = achieved_loss(prefix, experiment, relative)
    digest = hashlib.sha256(storage.read_bytes(path) or b"").hexdigest()
    seals = run_seals(prefix, experiment, relative)
    low = math.log(min(rung["compute"] for rung in rungs)) - 0.3
    high = math.log(max(prediction["compute"], *(rung["compute"] for rung in rungs))) + 0.3
    grid = [math.exp(low + (high - low) * n / (LAW_POINTS - 1)) for n in range(LAW_POINTS)]
    target = prediction["compute"]
    series = [
        {"label": "rungs (final loss)", "kind": "points", "points": {r["compute"]: r["final_loss"] for r in rungs}},
        {"label": "fit", "kind": "line", "points": {c: law(fit, c) for c in grid}},
        {"label": "prediction", "kind": "points", "points": {target: prediction["loss"]}},
        {"label": "band low", "kind": "band_low", "points": {target: prediction["low"]}},
        {"label": "band high", "kind": "band_high", "points": {target: prediction["high"]}},
    ]
    if achieved:
        series.append({"label": "achieved", "kind": "points", "points": {target: achieved["loss"]}})
    return {
        "fit": fit,
        "prediction": prediction,
        "target": figures["target"],
        "rungs": rungs,
        "achieved": achieved,
        "prediction_sha256": digest,
        "sealed_by": seals,
        "seal_warning": broken_seals(digest, seals),
        "curve_points": figures["curve_points"],
        "warnings": [str(warning) for warning in document.get("warnings") or []],
        "chart": chart("ladder", "loss vs compute", series, x_label="training FLOPs", log_x=True),
        "compare": compare_chart(document, experiment, relative),
        "compare_flops": compare_flops_chart(document, experiment, relative),
        "flops_per_token": {str(rung.get("name")): flops_per_token(rung) for rung in document.get("rungs") or []}
        | {"target": flops_per_token(figures["target"])},
    }
