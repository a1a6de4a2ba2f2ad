"""What the scaling step refuses, and what it flags, before a prediction is registered.

A prediction is registered before the target run starts and the target is watched against it for months,
so a fit that cannot mean anything must not leave the step SUCCESS:

- a rung whose final or in-training eval loss is not finite (a run that diverged) fails the step, naming
  the rung, the file and the training step of the bad value;
- a fit with alpha <= 0 (loss flat or rising with compute: the rungs are mislabelled, or one diverged)
  fails the step: extrapolating it says the bigger run does no better.

Two weaker signs are kept but flagged, in `prediction.json`'s `warnings`, the step's log and the ladder view:

- a fitted asymptote at its bound (0, or just under the lowest rung loss): the data did not pin E down,
  so the law's shape, and the extrapolation, come from the bound rather than the rungs;
- a band of zero width: the rungs lie exactly on the fitted law (no residual), so the band measured no
  noise, and the prediction's uncertainty is unknown, not zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from steps.scaling.scaling import PowerLawFit, Prediction

ASYMPTOTE_BOUND_TOLERANCE = 1e-6
"""An asymptote within this fraction of the lowest loss (or of 0) sits at the fit's bound."""
BAND_WIDTH_TOLERANCE = 1e-9
"""A band narrower than this fraction of the predicted loss has no width."""


class ScalingFitError(ValueError):
    """The rungs cannot give a meaningful prediction; the message names the step, the rung or the fit."""


def check_finite_losses(where: str, rung: str, source: str, steps: Sequence[str], losses: Sequence[float]) -> None:
    """Refuse a rung whose loss at any of `steps` (read from `source`) is NaN or infinite."""
    for step, loss in zip(steps, losses, strict=True):
        if not math.isfinite(loss):
            raise ScalingFitError(
                f"{where}: rung {rung} has a non-finite eval loss ({loss}) at {step} in {source}: its run "
                "diverged or was damaged; retrain or re-evaluate the rung, or leave it out of the ladder"
            )


def check_fit(where: str, fit: PowerLawFit, compute: Sequence[float], losses: Sequence[float]) -> None:
    """Refuse a fit whose loss does not fall with compute."""
    if not fit.alpha > 0:
        points = ", ".join(f"{loss:.4g} at {flops:.3g}" for loss, flops in zip(losses, compute, strict=True))
        raise ScalingFitError(
            f"{where}: the fitted exponent alpha = {fit.alpha:.4g} is not positive: the rungs' losses ({points} "
            "FLOPs) do not fall with compute, so any prediction would be an artefact; check each rung's flops and "
            "evaluate step, and retrain a rung that diverged"
        )


def fit_warnings(fit: PowerLawFit, prediction: Prediction, lowest_loss: float, fixed_asymptote: bool) -> list[str]:
    """Why this fit's prediction deserves less trust than its band says (empty: none)."""
    warnings = []
    if not fixed_asymptote:
        if fit.asymptote <= ASYMPTOTE_BOUND_TOLERANCE * lowest_loss:
            warnings.append(f"the fitted asymptote E = {fit.asymptote:.4g} sits at its lower bound 0: the rungs "
                            "do not pin E down; fix the asymptote or add rungs")  # fmt: skip
        elif fit.asymptote >= lowest_loss * (1 - ASYMPTOTE_BOUND_TOLERANCE):
            warnings.append(f"the fitted asymptote E = {fit.asymptote:.6g} sits at its upper bound, the lowest "
                            f"rung loss {lowest_loss:.6g}: the rungs do not pin E down; fix the asymptote or "
                            "add rungs")  # fmt: skip
    if prediction.high - prediction.low <= BAND_WIDTH_TOLERANCE * abs(prediction.loss):
        warnings.append(f"the prediction's band [{prediction.low:.6g}, {prediction.high:.6g}] has zero width: the "
                        "rungs lie exactly on the fitted law, so the band measured no noise and its uncertainty is "
                        "unknown, not zero; add rungs")  # fmt: skip
    return warnings
