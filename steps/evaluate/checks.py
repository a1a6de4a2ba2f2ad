"""The evaluate step refuses to record a score that is not a number.

A checkpoint whose weights went NaN or infinite (a run that diverged after it was saved, or damaged files)
scores a NaN loss; written as SUCCESS, that NaN would flow into the scaling fit and the dashboard as if it
were a result. So every figure of results.json must be finite before it is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class NonFiniteResultError(ValueError):
    """An evaluation produced NaN or infinite figures; the message names the checkpoint and the components."""


def check_finite_results(label: str, results: Mapping[str, Any]) -> None:
    """Refuse results whose macro or per-component figures, dropless ones included, are NaN or infinite."""
    if "dropless" in results:
        check_finite_results(f"{label} (dropless)", {**results["dropless"], "checkpoint": results["checkpoint"]})
    scored = {
        **results["components"],
        **{f"suite/{name}": by_figure for name, by_figure in results.get("suite", {}).items()},
    }
    figures = {f"{name} {figure}": value for name, by_figure in scored.items() for figure, value in by_figure.items()}
    figures |= {figure: results[figure] for figure in ("macro_loss", "macro_bpb")}
    bad = [f"{figure} = {value}" for figure, value in figures.items() if not math.isfinite(value)]
    if bad:
        raise NonFiniteResultError(
            f"{label}: the checkpoint {results['checkpoint']} scores {', '.join(bad)}: its weights are not finite "
            "(the run diverged by then, or the files are damaged). Evaluate an earlier checkpoint (checkpoint_path="
            "<train output>/checkpoints/step-N), or retrain from one with a lower learning rate"
        )
