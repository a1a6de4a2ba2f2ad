"""Fit loss against compute over a scaling ladder and predict a larger run before it starts.

The hero run's loss was pre-registered from its four-rung ladder: fit L(C) = E + A * C^-alpha to the
rungs' final eval losses, then read the prediction off at the hero's compute. Two fits are offered:

- a fixed asymptote E (the published method): log(L - E) = log A - alpha * log C is linear, so A and
  alpha are an ordinary least-squares line through (log C, log(L - E));
- a free asymptote: for each candidate E that line is still closed-form, so E is found by a bounded
  one-dimensional search on the residual (E must stay below the smallest observed loss), then all
  three are polished together by nonlinear least squares on the log residuals.

The band is a prediction interval for the target's loss (the achieved run is one more noisy point, not the
mean of many), at the `band` percentiles:

- with a fixed asymptote, the exact one of least squares with Gaussian noise on log(L - E): Student's t with
  n - 2 degrees of freedom times s * sqrt(1 + 1/n + (x - mean x)^2 / Sxx) around the line, mapped back to L;
  on simulated ladders of four it holds the next run 90% of the time for a 90% band;
- with a free asymptote, a residual bootstrap: keep every rung's compute, add resampled residuals (scaled
  up by sqrt(n / (n - 3))) to the fitted curve, refit, and read the target with one more resampled residual.

Resampling the rungs themselves (the earlier band) degenerates on a ladder of four: with a free asymptote
56% of resamples hold three distinct rungs (an exact fit, zero residual) and 34% too few to fit; with a
fixed one a third hold two (an exact line), and its band held the next run 77% of the time for a nominal
90%. Either band needs noise to measure: at least one rung more than the fitted parameters.

A predicted **loss curve** for the target run comes from the rungs' eval losses during training: at
each fraction f of training, fit the law across rungs to (compute of the whole run, loss at f) and
read the target at its own compute. Learning-rate schedules are defined in fractions of the run, so
losses at the same fraction are comparable across rungs; the curve is the target's expected loss at
f x its tokens. Each fraction is a fit of its own, so noise can make neighbours cross; a run's expected eval
loss does not rise with tokens, so the curve is projected on the non-increasing curves (least squares, pool
adjacent violators) before it is drawn, each point's band moving with it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import least_squares, minimize_scalar
from scipy.stats import t as student_t

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
    """Lower edge of the prediction band (the `band` percentile pair's first)."""
    high: float


def predict_with_band(
    compute: Sequence[float],
    loss: Sequence[float],
    target_compute: float,
    asymptote: float | None = None,
    *,
    samples: int = 1000,
    band: tuple[float, float] = (5.0, 95.0),
    seed: int = 0,
) -> Prediction:
    """The fit's prediction at `target_compute` with its prediction band (module docstring); `samples` and `seed`
    drive the free asymptote's bootstrap."""
    compute_array = np.asarray(compute, dtype=np.float64)
    loss_array = np.asarray(loss, dtype=np.float64)
    fit = fit_power_law(compute_array, loss_array, asymptote)
    parameters = MIN_RUNGS_FIXED if asymptote is not None else MIN_RUNGS_FREE
    if len(compute_array) <= parameters:
        raise ValueError(
            f"a band needs more rungs than fitted parameters: {len(compute_array)} rung(s) for {parameters} "
            f"parameters leave no residual to measure noise by; give at least {parameters + 1}"
        )
    if asymptote is not None:
        low, high = _line_prediction_band(np.log(compute_array), fit, target_compute, band)
    else:
        draws = residual_bootstrap(compute_array, loss_array, target_compute, fit, samples=samples, seed=seed)
        low, high = (float(edge) for edge in np.percentile(draws, band))
    return Prediction(compute=target_compute, loss=float(fit.predict(target_compute)), low=low, high=high)


def _line_prediction_band(
    log_compute: np.ndarray, fit: PowerLawFit, target_compute: float, band: tuple[float, float]
) -> tuple[float, float]:
    """Least squares' prediction interval for one more point of the line log(L - E) = log A - alpha log C."""
    count = len(log_compute)
    noise = fit.rms_log_residual * math.sqrt(count / (count - MIN_RUNGS_FIXED))  # unbiased: n - 2 freedoms
    spread = float(np.sum((log_compute - log_compute.mean()) ** 2))
    log_target = math.log(target_compute)
    error = noise * math.sqrt(1 + 1 / count + (log_target - log_compute.mean()) ** 2 / spread)
    centre = math.log(fit.A) - fit.alpha * log_target
    low, high = (float(student_t.ppf(percent / 100, count - MIN_RUNGS_FIXED)) for percent in band)
    return fit.asymptote + math.exp(centre + low * error), fit.asymptote + math.exp(centre + high * error)


def residual_bootstrap(
    compute: np.ndarray, loss: np.ndarray, target_compute: float, fit: PowerLawFit, *, samples: int, seed: int = 0
) -> np.ndarray:
    """`samples` draws of the target's loss under a free asymptote: refits to the fitted curve plus resampled
    residuals, each read at the target with one more resampled residual. Every draw keeps every rung."""
    log_compute = np.log(compute)
    fitted = np.log(fit.A) - fit.alpha * log_compute
    # Residuals of a least-squares fit are smaller than the noise by (n - p) / n in variance: scale them back up.
    residuals = (np.log(loss - fit.asymptote) - fitted) * math.sqrt(len(compute) / (len(compute) - MIN_RUNGS_FREE))
    rng = np.random.default_rng(seed)
    draws = np.empty(samples)
    for index in range(samples):
        resampled = fit.asymptote + np.exp(fitted + rng.choice(residuals, size=len(compute)))
        refit = fit_power_law(compute, resampled)
        draws[index] = refit.asymptote + refit.A * target_compute**-refit.alpha * math.exp(rng.choice(residuals))
    return draws


def non_increasing(values: Sequence[float]) -> list[float]:
    """The least-squares non-increasing sequence nearest `values` (pool adjacent violators)."""
    blocks: list[tuple[float, int]] = []  # (mean, length) of each pooled run, left to right
    for value in values:
        mean, length = float(value), 1
        # A value above the run before it violates the order: pool the two into their mean, and repeat.
        while blocks and blocks[-1][0] < mean:
            previous_mean, previous_length = blocks.pop()
            mean = (previous_mean * previous_length + mean * length) / (previous_length + length)
            length += previous_length
        blocks.append((mean, length))
    return [mean for mean, length in blocks for _ in range(length)]


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
    """The target's predicted eval loss at each fraction of its training, non-increasing (module docstring);
    `compute` holds its tokens there. `samples`: bootstrap draws per point under a free asymptote."""
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
        at_fraction = predict_with_band(
            [rung.compute for rung in rungs], losses_at_fraction, target_compute, asymptote, samples=samples
        )
        curve.append(at_fraction)
    # The band moves with its point: its width is each fraction's own (it may widen towards the end).
    loss = non_increasing([point.loss for point in curve])
    return [
        Prediction(
            compute=fraction * target_tokens,
            loss=level,
            low=point.low + level - point.loss,
            high=point.high + level - point.loss,
        )
        for fraction, level, point in zip(fractions, loss, curve, strict=True)
    ]


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
        # The central fit can fall outside a bootstrap band (few rungs): draw the band's side as empty then.
        yerr=[[max(0.0, prediction.loss - prediction.low)], [max(0.0, prediction.high - prediction.loss)]],
        fmt="*",
        color="#d62728",
        markersize=12,
        capsize=4,
        label="prediction (90% band)",
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
