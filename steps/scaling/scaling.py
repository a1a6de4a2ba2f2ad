"""Fit loss against compute over a scaling ladder and predict a larger run before it starts.

The hero run's loss was pre-registered from its four-rung ladder: fit L(C) = E + A * C^-alpha to the
rungs' final eval losses, then read the prediction off at the hero's compute. Two fits are offered:

- a fixed asymptote E (the published method): log(L - E) = log A - alpha * log C is linear, so A and
  alpha are an ordinary least-squares line through (log C, log(L - E));
- a free asymptote: for each candidate E that line is still closed-form, so E is found by a bounded
  one-dimensional search on the residual (E must stay below the smallest observed loss), then all
  three are polished together by nonlinear least squares on the log residuals.

Uncertainty comes from a bootstrap over rungs (resample the rungs with replacement, refit, read the
prediction): with four rungs it is coarse, and says so by being wide.

A predicted **loss curve** for the target run comes from the rungs' eval losses during training: at
each fraction f of training, fit the law across rungs to (compute of the whole run, loss at f) and
read the target at its own compute. Learning-rate schedules are defined in fractions of the run, so
losses at the same fraction are comparable across rungs; the curve is the target's expected loss at
f x its tokens.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import least_squares, minimize_scalar

MIN_RUNGS_FIXED = 2
MIN_RUNGS_FREE = 3


@dataclass(frozen=True)
class PowerLawFit:
    """L(C) = asymptote + A * C^-alpha."""

    A: float
    alpha: float
    asymptote: float
    rms_log_residual: float
    """Root-mean-square residual of log(L - E) over the fitted points: 0 for an exact law."""

    def predict(self, compute: float | np.ndarray) -> float | np.ndarray:
        return self.asymptote + self.A * np.power(compute, -self.alpha)


def _line_fit(log_compute: np.ndarray, log_excess: np.ndarray) -> tuple[float, float, float]:
    """Least-squares line: returns (log A, alpha, rms residual)."""
    slope, intercept = np.polyfit(log_compute, log_excess, 1)
    residual = log_excess - (intercept + slope * log_compute)
    return float(intercept), float(-slope), float(np.sqrt(np.mean(residual**2)))


def _line_fit_residuals(log_compute: np.ndarray, log_excess: np.ndarray) -> np.ndarray:
    """The rms residual of `_line_fit` for each row of `log_excess` at once (closed-form least squares)."""
    centred = log_compute - log_compute.mean()
    slope = (log_excess - log_excess.mean(axis=1, keepdims=True)) @ centred / (centred @ centred)
    fitted = log_excess.mean(axis=1, keepdims=True) + slope[:, None] * centred[None, :]
    return np.sqrt(np.mean((log_excess - fitted) ** 2, axis=1))


def _check_points(compute: np.ndarray, loss: np.ndarray, needed: int) -> None:
    if compute.shape != loss.shape or compute.ndim != 1:
        raise ValueError(f"compute and loss must be 1-D and of one length, got {compute.shape} and {loss.shape}")
    if len(np.unique(compute)) < needed:
        raise ValueError(
            f"a power-law fit needs at least {needed} distinct compute values, got {len(np.unique(compute))}"
        )
    if not (np.all(np.isfinite(compute)) and np.all(np.isfinite(loss)) and np.all(compute > 0)):
        raise ValueError("compute must be positive and finite, and loss finite")


def fit_power_law(
    compute: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray, asymptote: float | None = None
) -> PowerLawFit:
    """Fit L(C) = E + A * C^-alpha; E fixed when `asymptote` is given, else fitted too."""
    compute_array = np.asarray(compute, dtype=np.float64)
    loss_array = np.asarray(loss, dtype=np.float64)
    _check_points(compute_array, loss_array, MIN_RUNGS_FIXED if asymptote is not None else MIN_RUNGS_FREE)
    log_compute = np.log(compute_array)
    if asymptote is not None:
        if np.any(loss_array <= asymptote):
            raise ValueError(f"every loss must exceed the asymptote {asymptote}; the lowest is {loss_array.min()}")
        log_a, alpha, rms = _line_fit(log_compute, np.log(loss_array - asymptote))
        return PowerLawFit(A=math.exp(log_a), alpha=alpha, asymptote=asymptote, rms_log_residual=rms)

    lowest = float(loss_array.min())

    def residual_at(candidate: float) -> float:
        return _line_fit(log_compute, np.log(loss_array - candidate))[2]

    # The log residual is not unimodal in E (it dips sharply at the true E when the excess L - E is small
    # next to E), so scan candidates geometrically spaced below the lowest loss, then refine around the best.
    gaps = lowest * np.geomspace(1e-9, 1.0, 400)
    best = int(np.argmin(_line_fit_residuals(log_compute, np.log(loss_array[None, :] - (lowest - gaps)[:, None]))))
    bracket = (lowest - gaps[min(best + 1, len(gaps) - 1)], lowest - gaps[max(best - 1, 0)])
    searched = minimize_scalar(residual_at, bounds=bracket, method="bounded", options={"xatol": 1e-14 * lowest})
    log_a, alpha, _ = _line_fit(log_compute, np.log(loss_array - searched.x))

    def log_residuals(params: np.ndarray) -> np.ndarray:
        excess = np.maximum(loss_array - params[2], 1e-300)
        return np.log(excess) - (params[0] - params[1] * log_compute)

    polished = least_squares(
        log_residuals,
        x0=[log_a, alpha, searched.x],
        bounds=([-np.inf, -np.inf, 0.0], [np.inf, np.inf, lowest * (1 - 1e-12)]),
        xtol=1e-15,
        ftol=1e-15,
        gtol=1e-15,
    )
    log_a, alpha, fitted_asymptote = (float(value) for value in polished.x)
    rms = float(np.sqrt(np.mean(log_residuals(polished.x) ** 2)))
    return PowerLawFit(A=math.exp(log_a), alpha=alpha, asymptote=fitted_asymptote, rms_log_residual=rms)


@dataclass(frozen=True)
class Prediction:
    compute: float
    loss: float
    low: float
    """Lower edge of the bootstrap band (the `band` percentile pair's first)."""
    high: float


def bootstrap_prediction(
    compute: Sequence[float],
    loss: Sequence[float],
    target_compute: float,
    asymptote: float | None = None,
    *,
    samples: int = 1000,
    band: tuple[float, float] = (5.0, 95.0),
    seed: int = 0,
) -> Prediction:
    """The fit's prediction at `target_compute`, with a band from refitting resampled rungs."""
    compute_array = np.asarray(compute, dtype=np.float64)
    loss_array = np.asarray(loss, dtype=np.float64)
    central = float(fit_power_law(compute_array, loss_array, asymptote).predict(target_compute))
    needed = MIN_RUNGS_FIXED if asymptote is not None else MIN_RUNGS_FREE
    rng = np.random.default_rng(seed)
    predictions = []
    for _ in range(samples):
        chosen = rng.integers(0, len(compute_array), size=len(compute_array))
        if len(np.unique(compute_array[chosen])) < needed:
            continue  # too few distinct rungs to fit: not a sample of the fit's uncertainty
        fit = fit_power_law(compute_array[chosen], loss_array[chosen], asymptote)
        predictions.append(float(fit.predict(target_compute)))
    if not predictions:
        return Prediction(compute=target_compute, loss=central, low=central, high=central)
    low, high = np.percentile(predictions, band)
    return Prediction(compute=target_compute, loss=central, low=float(low), high=float(high))


@dataclass(frozen=True)
class RungCurve:
    """One rung's training: its total compute and its eval loss at points through training."""

    name: str
    compute: float
    """Training FLOPs of the whole run."""
    tokens: Sequence[float]
    """Tokens seen at each eval, increasing; the last is the run's total."""
    loss: Sequence[float]
    """Eval loss at each of `tokens`."""


def predict_loss_curve(
    rungs: Sequence[RungCurve],
    target_compute: float,
    target_tokens: float,
    asymptote: float | None = None,
    *,
    fractions: Sequence[float] = tuple(np.linspace(0.1, 1.0, 19)),
    samples: int = 200,
) -> list[Prediction]:
    """The target's predicted eval loss at each fraction of its training; `compute` holds its tokens there."""
    curve = []
    for fraction in fractions:
        losses_at_fraction = []
        for rung in rungs:
            tokens = np.asarray(rung.tokens, dtype=np.float64)
            position = fraction * tokens[-1]
            if position < tokens[0]:
                raise ValueError(
                    f"rung {rung.name} has no eval before {fraction:.0%} of training (first at {tokens[0]:.3g} tokens)"
                )
            losses_at_fraction.append(float(np.interp(position, tokens, np.asarray(rung.loss, dtype=np.float64))))
        at_fraction = bootstrap_prediction(
            [rung.compute for rung in rungs], losses_at_fraction, target_compute, asymptote, samples=samples
        )
        curve.append(
            Prediction(
                compute=fraction * target_tokens, loss=at_fraction.loss, low=at_fraction.low, high=at_fraction.high
            )
        )
    return curve


def prediction_document(
    fit: PowerLawFit, prediction: Prediction, curve: Sequence[Prediction], rungs: Sequence[RungCurve]
) -> dict:
    """The JSON the dashboard's ladder and run views draw: fit, prediction, rungs and the predicted curve."""
    return {
        "fit": asdict(fit),
        "prediction": asdict(prediction),
        "rungs": [{"name": rung.name, "compute": rung.compute, "final_loss": float(rung.loss[-1])} for rung in rungs],
        "curve": [
            {"tokens": point.compute, "loss": point.loss, "low": point.low, "high": point.high} for point in curve
        ],
    }


def plot_fit(compute: Sequence[float], loss: Sequence[float], fit: PowerLawFit, prediction: Prediction) -> bytes:
    """A PNG of loss vs compute (log x): the rungs, the fitted law out to the target, the prediction and its band."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the plot is a file
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    grid = np.logspace(math.log10(min(compute)) - 0.2, math.log10(prediction.compute) + 0.2, 200)
    axes.plot(
        grid, fit.predict(grid), color="#1f77b4", label=f"L = {fit.asymptote:.3g} + {fit.A:.3g}·C^-{fit.alpha:.3g}"
    )
    axes.scatter(compute, loss, color="#1f77b4", zorder=3, label="ladder rungs")
    axes.errorbar(
        [prediction.compute],
        [prediction.loss],
        # The central fit can fall outside its bootstrap band (few rungs): draw the band's side as empty then.
        yerr=[[max(0.0, prediction.loss - prediction.low)], [max(0.0, prediction.high - prediction.loss)]],
        fmt="*",
        color="#d62728",
        markersize=12,
        capsize=4,
        label="prediction (bootstrap band)",
    )
    axes.set_xscale("log")
    axes.set_xlabel("training FLOPs")
    axes.set_ylabel("eval loss")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    plt.close(figure)
    return png.getvalue()
