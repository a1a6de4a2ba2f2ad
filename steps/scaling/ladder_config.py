"""The ladder step's config, `LadderConfig` with its rungs and target, apart from the step (steps/scaling/ladder.py,
which loads SciPy for the fit): a DAG's definition builds it with nothing but the standard library."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MACRO_LOSS = "eval/macro_loss"
SUITE_MACRO_LOSS = "eval/suite/macro_loss"


@dataclass(frozen=True)
class LadderRung:
    """One trained and evaluated rung."""

    name: str
    """Shown in plots and tables (e.g. "d768")."""
    train_path: str
    """The rung's train step output (metrics.jsonl). A dependency."""
    evaluate_path: str
    """The rung's evaluate step output (results.json). A dependency."""
    flops: float
    """Training FLOPs of the whole run (steps/model/model_size.training_flops)."""
    tokens: float
    """Tokens the run trains on."""
    tokens_per_step: float
    """Batch size x sequence length: turns a logged step into tokens."""


@dataclass(frozen=True)
class LadderTarget:
    """The run the ladder predicts."""

    name: str
    flops: float
    tokens: float
    tokens_per_step: float


@dataclass(frozen=True)
class LadderConfig:
    rungs: Sequence[LadderRung]
    """At least four rungs (a free asymptote) or three (a fixed one): one more than the fitted parameters, so
    that the band has residuals to measure noise by. Versioned through their figures."""
    target: LadderTarget
    """What to predict. Versioned."""
    output_path: str
    """Where prediction.json and fit.png go (THIS_OUTPUT_PATH)."""
    asymptote: float | None = None
    """Fix the irreducible loss E (the published method; what `default_scaling` does) or fit it (None).
    Versioned."""
    bootstrap_samples: int = 1000
    """Residual-bootstrap draws behind the band when the asymptote is free (a fixed one's band is closed-form;
    steps/scaling/scaling.py). Versioned."""
    metric: str = MACRO_LOSS
    """The train steps' logged loss the curve reads: `eval/macro_loss` (every component's) or, with an eval
    suite, `SUITE_MACRO_LOSS`, whose final point is then the evaluate steps' suite `macro_loss`. Versioned."""
