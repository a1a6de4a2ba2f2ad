"""The metric names the training views and alert rules read: what steps/train and steps/evaluate log.

The executor runs any DAG and never imports steps/; these names are the convention between the train step's
`metrics.jsonl` (steps/train/train_metrics.py) and the views that draw it (steps/scaling/ladder.py names the
same eval metrics for the fit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRAIN_LOSS = "train/loss"
SUITE_MACRO_LOSS = "eval/suite/macro_loss"
"""A run with an eval suite (steps/tokenize/eval_suite.py): the mean over its subsets, what the ladder predicts."""
MACRO_LOSS = "eval/macro_loss"
"""Levanter's mean over every evaluated component (cells and suite subsets alike)."""


def predicted_metric(rows: Mapping[int, Mapping[str, Any]]) -> str:
    """The eval line a run's prediction is drawn against: the suite's macro loss where the run logs one."""
    return SUITE_MACRO_LOSS if any(SUITE_MACRO_LOSS in row for row in rows.values()) else MACRO_LOSS
