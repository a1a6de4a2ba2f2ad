"""The composition view of a mixture: topic x quality cells, from a cells step and/or a mixture-weights step.

A cells step's output holds `composition.json` (`{"topics", "quality_buckets", "bucket_edges", "cells": {name:
{"topic", "quality_bucket", "docs", "tokens", "share", "top_terms", "samples"}}}`); a mixture-weights step's
holds `weights.json` (`{"phases": [{"fraction", "tokens", "weights": {cell: w}}], "expected_epochs": {cell: e},
"capped": [[cell, ...] per phase], "empty": [cell, ...]}`) and names its cells step by the config field
`composition_path`. The view joins the two per cell, so one table holds what the hero published as its data
page: tokens, share, weight per phase, expected epochs, top terms and sample snippets.

A train step's view shows, per mixture phase and component, the planned share, the share served and its tokens
(executor/watch/training/served_mixture.py: from its `mixture.json` and the `data/tokens/<component>` figures of its
metrics), and flags each component served more than 20% off its plan.
"""

from __future__ import annotations

from typing import Any

from executor.store import storage
from executor.store.layout import COMPOSITION_FILE, METRICS_FILE, MIXTURE_FILE, WEIGHTS_FILE, relative_to
from executor.watch import files
from executor.watch.training.alerts import AlertRules
from executor.watch.training.panels import PanelError, config_path, numbers, read_json
from executor.watch.training.served_mixture import drifted, served_by_phase

MAX_CELLS = 20_000


def eaten_by_phase(output_path: str) -> dict[str, Any] | None:
    """Per phase of a train step's mixture, each component's planned share, served share and tokens, and the
    components that drifted (executor/watch/training/served_mixture.py); None: not a train step that logs its tokens."""
    mixture = read_json(storage.join(output_path, MIXTURE_FILE), "composition view")
    if not isinstance(mixture, dict) or not mixture.get("schedule"):
        return None
    served = served_by_phase(files.metrics_records(storage.join(output_path, METRICS_FILE)) or [], mixture)
    if served is not None:
        rules = AlertRules()
        served["drifted"] = drifted(served, rules.mixture_drift, rules.mixture_drift_min_blocks)
    return served


def _cells(composition: Any, path: str) -> list[dict[str, Any]]:
    cells = composition.get("cells") if isinstance(composition, dict) else None
    if not isinstance(cells, dict):
        raise PanelError(f"{path} has no 'cells' object; rerun the cells step")
    if len(cells) > MAX_CELLS:
        raise PanelError(f"{path} lists {len(cells)} cells, over the {MAX_CELLS} the view draws")
    rows = []
    for name, cell in sorted(cells.items()):
        figures = numbers(cell, ("docs", "tokens"), f"{path} cell {name!r}")
        topic, bucket = (cell.get(key) for key in ("topic", "quality_bucket"))
        rows.append({
            "name": name,
            "topic": topic if isinstance(topic, int) else None,
            "bucket": bucket if isinstance(bucket, int) else None,
            "docs": int(figures["docs"]),
            "tokens": int(figures["tokens"]),
            "share": cell.get("share"),
            "top_terms": [str(term) for term in cell.get("top_terms") or []][:20],
            "samples": [str(sample) for sample in cell.get("samples") or []][:5],
        })  # fmt: skip
    return rows


def _weights(weights: Any, path: str, names: set[str]) -> dict[str, Any]:
    phases = weights.get("phases") if isinstance(weights, dict) else None
    if not isinstance(phases, list) or not phases:
        raise PanelError(f"{path} has no 'phases' list; rerun the mixture-weights step")
    checked = []
    for number, phase in enumerate(phases):
        figures = numbers(phase, ("fraction", "tokens"), f"{path} phases[{number}]")
        phase_weights = phase.get("weights")
        if not isinstance(phase_weights, dict):
            raise PanelError(f"{path} phases[{number}] has no 'weights' object")
        unknown = sorted(set(phase_weights) - names)
        if unknown:
            raise PanelError(f"{path} phases[{number}] weighs cells the composition does not list: {unknown[:5]}; "
                             "the weights were computed from another cells output")  # fmt: skip
        checked.append(figures | {"weights": phase_weights})
    capped = weights.get("capped") or []
    return {
        "phases": checked,
        "expected_epochs": weights.get("expected_epochs") or {},
        "capped": [set(listed) if isinstance(listed, list) else set() for listed in capped],
        "max_epochs": weights.get("max_epochs"),
        "train_tokens": weights.get("train_tokens"),
    }


def composition_view(prefix: str, output_path: str) -> dict[str, Any]:
    composition_path = storage.join(output_path, COMPOSITION_FILE)
    weights_path = storage.join(output_path, WEIGHTS_FILE)
    composition = read_json(composition_path, "composition view")
    weights = read_json(weights_path, "composition view")
    eaten = eaten_by_phase(output_path)
    if composition is None and weights is None and eaten is not None:
        return {"cells": [], "phases": [], "eaten": eaten}
    if composition is None and weights is None:
        raise PanelError(f"composition view: neither {COMPOSITION_FILE} nor {WEIGHTS_FILE} under {output_path}")
    if composition is None:
        linked = config_path(prefix, output_path, "composition_path", COMPOSITION_FILE)
        if linked is None:
            raise PanelError(f"composition view: {weights_path} has weights, but the step's config names no "
                             "composition_path, so the cells' topics and quality buckets are unknown")  # fmt: skip
        composition_path = linked
        composition = read_json(composition_path, "composition view")
        if composition is None:
            raise PanelError(f"composition view: no {composition_path}; has the cells step finished?")
    cells = _cells(composition, composition_path)
    mixture = _weights(weights, weights_path, {cell["name"] for cell in cells}) if weights is not None else None
    for cell in cells:
        if mixture is not None:
            cell["weights"] = [phase["weights"].get(cell["name"], 0.0) for phase in mixture["phases"]]
            cell["expected_epochs"] = mixture["expected_epochs"].get(cell["name"])
            cell["capped"] = [number for number, names in enumerate(mixture["capped"]) if cell["name"] in names]
    topics = [cell["topic"] for cell in cells if cell["topic"] is not None]
    buckets = [cell["bucket"] for cell in cells if cell["bucket"] is not None]
    return {
        "composition": relative_to(prefix, storage.dirname(composition_path)),
        "weights": relative_to(prefix, output_path) if mixture is not None else None,
        "topics": int(composition.get("topics") or (max(topics) + 1 if topics else 0)),
        "quality_buckets": int(composition.get("quality_buckets") or (max(buckets) + 1 if buckets else 0)),
        "bucket_edges": composition.get("bucket_edges"),
        "docs": sum(cell["docs"] for cell in cells),
        "tokens": sum(cell["tokens"] for cell in cells),
        "phases": [{"fraction": p["fraction"], "tokens": p["tokens"]} for p in mixture["phases"]] if mixture else [],
        "max_epochs": mixture["max_epochs"] if mixture else None,
        "cells": cells,
        "eaten": eaten,
    }
