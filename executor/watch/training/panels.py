"""Views of the step page chosen by what a step's output holds, never by the step's name.

    metrics.jsonl with train/loss rows    run view (run_view.py): loss and the eval metric the ladder predicts
                                          against the predicted curve of the scaling step that the config's
                                          `prediction_path` names, the run's other figures, its alerts
    prediction.json                       ladder view (ladder.py): the rungs' final losses against compute, the
                                          fitted law out to the target, the prediction's band, the achieved loss
    composition.json and/or weights.json  composition view: topic x quality cells with tokens, weights per
                                          phase, expected epochs, top terms, samples; a weights step's config
                                          names its cells step by `composition_path`
    mixture.json beside a run             composition view: the tokens of each component eaten per phase

The server aligns each chart's series on one x axis (`chart`), so the browser only draws. Paths a step's
config names are full paths the executor wrote; they are read only when they lie under the prefix, through
`resolve_under`, like any path from a request. Reads are bounded (MAX_JSON_BYTES, and files.py's metrics
limit), and a file that is missing or not in the shape a view needs raises `PanelError` with the file and
what to do, which the app answers as 422 with that message instead of a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from executor.store import storage
from executor.store.layout import (
    COMPOSITION_FILE,
    INFO_FILE,
    LINEAGE_FILE,
    METRICS_FILE,
    MIXTURE_FILE,
    PREDICTION_FILE,
    WEIGHTS_FILE,
    relative_to,
)
from executor.store.metrics_log import metric_number, read_metrics_bytes, rows_by_step
from executor.watch import files
from executor.watch.safety import resolve_under
from executor.watch.training.metric_names import SUITE_MACRO_LOSS, TRAIN_LOSS

MAX_JSON_BYTES = 16 * 1024 * 1024
RUN_DETECT_BYTES = 256 * 1024
"""How much of metrics.jsonl is searched for a train/loss key (it comes with the first logged step)."""


class PanelError(ValueError):
    """A file a view draws is missing or not in the shape it needs; the message says which and what to do."""


def read_json(full_path: str, where: str) -> Any | None:
    """A JSON document of at most MAX_JSON_BYTES, or None when the file does not exist."""
    fs, fs_path = storage.filesystem(full_path)
    try:
        with fs.open(fs_path, "rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_JSON_BYTES:
        raise PanelError(f"{where}: {full_path} is over {MAX_JSON_BYTES >> 20} MiB; the dashboard does not draw it")
    try:
        return json.loads(data)
    except ValueError as error:
        raise PanelError(
            f"{where}: {full_path} is not valid JSON ({error}); the step that writes it may have been cut off: "
            "rerun that step"
        ) from error


def numbers(document: Any, keys: Iterable[str], where: str) -> dict[str, float]:
    """`document[key]` for each key, each a finite number, or PanelError naming the first that is not."""
    if not isinstance(document, Mapping):
        raise PanelError(f"{where} is {type(document).__name__}, not an object")
    values = {}
    for key in keys:
        value = files.number(document.get(key))
        if value is None:
            raise PanelError(f"{where} has no finite number {key!r} (got {document.get(key)!r})")
        values[key] = value
    return values


def step_config(output_path: str) -> dict[str, Any]:
    """The resolved config recorded in the step's `.executor_info` ({} when there is none)."""
    info = read_json(storage.join(output_path, INFO_FILE), f"step at {output_path}")
    config = info.get("config") if isinstance(info, dict) else None
    return config if isinstance(config, dict) else {}


def recorded_prefix(prefix: str, output_path: str) -> str | None:
    """The prefix the step ran under, from the output path its `.executor_info` recorded, when that is not this
    one: the prefix was copied, synced or moved (a bucket mirrored to a folder), so its absolute paths are stale."""
    info = read_json(storage.join(output_path, INFO_FILE), f"step at {output_path}")
    recorded = info.get("output_path") if isinstance(info, dict) else None
    relative = relative_to(prefix, output_path)
    if not isinstance(recorded, str) or relative is None or not recorded.endswith("/" + relative):
        return None
    old = recorded[: -len(relative) - 1]
    return old if old.rstrip("/") != prefix.rstrip("/") else None


def relative_here(prefix: str, output_path: str, target: str) -> str | None:
    """A path the step recorded (a config field, its lineage's parent), relative to this prefix: under it, or
    under the prefix the step ran under (a copied prefix renders the same). None if it lies outside both."""
    relative = relative_to(prefix, target)
    if relative is None and (old := recorded_prefix(prefix, output_path)) is not None:
        relative = relative_to(old, target)
    return relative


def config_path(prefix: str, output_path: str, field: str, file: str) -> str | None:
    """`<config[field]>/<file>` under the prefix, None if the config has no such field; PanelError if it lies
    outside the prefix (the dashboard reads nothing there)."""
    target = step_config(output_path).get(field)
    if not target:
        return None
    relative = relative_here(prefix, output_path, target) if isinstance(target, str) else None
    if relative is None:
        raise PanelError(f"the step's config field {field} = {target!r} is not a path under the dashboard's prefix "
                         f"{prefix}, so it is not read; open a dashboard on the prefix that holds it")  # fmt: skip
    return resolve_under(prefix, f"{relative}/{file}")


def available(output_path: str) -> list[str]:
    """The views that apply to the step at `output_path`, by the files it holds."""
    present = {name: storage.exists(storage.join(output_path, name))
               for name in (PREDICTION_FILE, COMPOSITION_FILE, WEIGHTS_FILE, MIXTURE_FILE)}  # fmt: skip
    views = []
    head = read_metrics_bytes(storage.join(output_path, METRICS_FILE), RUN_DETECT_BYTES)
    if head is not None and f'"{TRAIN_LOSS}"'.encode() in head:  # no metrics.jsonl: no run view
        views.append("run")
    if present[PREDICTION_FILE]:
        views.append("ladder")
    if present[COMPOSITION_FILE] or present[WEIGHTS_FILE] or (present[MIXTURE_FILE] and "run" in views):
        views.append("composition")  # a train step's: what it ate per mixture phase
    return views


def chart(chart_id: str, title: str, series: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    """A chart whose series ({"label", "kind", "points": {x: y}}) share one sorted x axis (None where a series
    has no point): what uPlot draws. Kinds: line, points, dashed, band_low / band_high (shaded between)."""
    xs = sorted({x for entry in series for x in entry["points"]})
    return {
        "id": chart_id,
        "title": title,
        "x": xs,
        "series": [
            {"label": entry["label"], "kind": entry["kind"], "values": [entry["points"].get(x) for x in xs]}
            for entry in series
        ],
        **options,
    }


def eval_components(rows: Mapping[int, Mapping[str, Any]], under: str = "eval/") -> list[str]:
    """The components (or, `under="eval/suite/"`, the eval suite's subsets) with a loss of their own; "suite",
    the suite's parent tag (Levanter's micro average over its subsets), is none."""
    keys = {key for row in rows.values() for key in row}
    depth = under.count("/") + 1
    return sorted(
        name
        for key in keys
        if key.startswith(under)
        and key.endswith("/loss")
        and key.count("/") == depth
        and (name := key[len(under) : -len("/loss")]) != "suite"
    )


def macro_eval(row: Mapping[str, Any], components: list[str]) -> float | None:
    """What the ladder predicts: the eval suite's macro loss (eval/suite/macro_loss), else Levanter's
    eval/macro_loss (the mean over components), else the mean of the eval/<component>/loss of the row, else
    eval/loss when the run has no components. A loss that is not finite is kept (NaN in, NaN out: it is marked)."""
    if (suite := metric_number(row.get(SUITE_MACRO_LOSS))) is not None:
        return suite
    if (macro := metric_number(row.get("eval/macro_loss"))) is not None:
        return macro
    losses = [metric_number(row.get(f"eval/{component}/loss")) for component in components]
    if components and all(loss is not None for loss in losses):
        return sum(losses) / len(losses)  # type: ignore[arg-type]
    return metric_number(row.get("eval/loss")) if not components else None


def predicted_curve(prefix: str, output_path: str) -> tuple[list[dict[str, float]], str | None, str | None]:
    """The predicted curve of the scaling step the config's `prediction_path` names: (points, its relative path,
    a message when it cannot be drawn)."""
    try:
        path = config_path(prefix, output_path, "prediction_path", PREDICTION_FILE)
        if path is None:
            return [], None, None
        where = f"prediction_path's {PREDICTION_FILE}"
        document = read_json(path, where)
        if document is None:
            raise PanelError(f"{where}: no {path} yet; the scaling step has not finished")
        curve = document.get("curve") if isinstance(document, dict) else None
        if not isinstance(curve, list):
            raise PanelError(f"{where}: {path} has no 'curve' list")
        points = [
            numbers(point, ("step", "loss", "low", "high"), f"{path} curve[{n}]") for n, point in enumerate(curve)
        ]
    except PanelError as error:
        return [], None, str(error)
    return points, relative_to(prefix, path.rsplit("/", 1)[0]), None


def parent_curve(prefix: str, output_path: str) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """A fork's parent's metrics rows up to the step it forked at, and the lineage ({parent, step}) to show;
    nothing for a run that is no fork, or whose parent lies outside the prefix."""
    lineage = read_json(storage.join(output_path, LINEAGE_FILE), LINEAGE_FILE)
    if not isinstance(lineage, dict) or not isinstance(lineage.get("parent"), str):
        return {}, None
    relative = relative_here(prefix, output_path, lineage["parent"])
    if relative is None:
        return {}, {"parent": None, "step": lineage.get("step")}
    records = files.metrics_records(storage.join(resolve_under(prefix, relative), METRICS_FILE)) or []
    fork_at = lineage.get("step")
    last: float = fork_at if isinstance(fork_at, int) else math.inf
    rows = rows_by_step(records)
    return {step: row for step, row in rows.items() if step <= last}, {"parent": relative, "step": fork_at}
