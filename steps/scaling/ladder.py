"""The scaling step: fit loss against compute over a ladder's rungs and register the target run's prediction.

    prediction = ExecutorStep(
        name="scaling/hero",
        fn=predict_from_ladder,
        config=LadderConfig(
            rungs=[LadderRung(name="d768", train_path=output_path_of(train_d768),
                              evaluate_path=output_path_of(eval_d768), flops=5.5e19, tokens=48e9,
                              tokens_per_step=1024 * 4096), ...],
            target=LadderTarget(name="d6144", flops=2.7e24, tokens=18e12, tokens_per_step=11264 * 4096),
            output_path=THIS_OUTPUT_PATH,
        ),
    )

Each rung contributes its final macro held-out loss (the evaluate step's `results.json`) at its training
FLOPs (steps/model/model_size.py), and its eval losses during training (the train step's `metrics.jsonl`:
`metric` at each eval) for the predicted loss curve. With an eval suite (the hero DAG's) both are the suite's
macro loss over the same sequences (`eval/suite/macro_loss`, steps/tokenize/eval_suite.py): Paloma's metric,
on text that never entered training, one measurement from the first eval to the final point. The fit
and the prediction band are steps/scaling/scaling.py's. The target's train step takes this step's output as a
dependency, so the prediction is on disk, hashed and dated, before the target starts.

A rung that lacks what the fit reads is refused, naming the rung and the file: no results.json, or one that is
empty, cut short or without `macro_loss`; no metrics.jsonl, or one without an eval line before the run's end
(the predicted curve would collapse to its last point). The curve always has `CURVE_POINTS` points.

Output: `prediction.json` (the dashboard's ladder view and the target's run view draw it; format in
`scaling.prediction_document`, plus `target` and each rung's `tokens` and `curve`) and `fit.png`.
"""

from __future__ import annotations

import logging

import numpy as np

from executor import storage
from steps.scaling.fit_checks import check_finite_losses, check_fit, fit_warnings
from steps.scaling.ladder_config import MACRO_LOSS, SUITE_MACRO_LOSS, LadderConfig, LadderRung
from steps.scaling.scaling import (
    MIN_RUNGS_FIXED,
    MIN_RUNGS_FREE,
    RungCurve,
    fit_power_law,
    plot_fit,
    predict_loss_curve,
    predict_with_band,
    prediction_document,
)

logger = logging.getLogger(__name__)

PREDICTION_FILE = "prediction.json"
CURVE_POINTS = 19
"""Points of the predicted loss curve, from the first fraction of the run every rung was evaluated at to its end."""


def eval_curve(train_path: str, tokens_per_step: float, metric: str = MACRO_LOSS) -> tuple[list[float], list[float]]:
    """A rung's macro eval loss during training (Levanter's `eval/macro_loss`, or `eval/suite/macro_loss`: the
    mean over components, or suite subsets, of each one's token-weighted loss), as (tokens, loss) at each eval.

    Levanter logs the step just completed, counted from 0: a line at step s comes after s + 1 optimizer steps,
    so (s + 1) x tokens_per_step tokens. A resumed run logs some steps twice; the later line (the run that
    continued) wins."""
    from steps.train.train_metrics import read_metrics  # here: it loads Levanter's tracker, which plans need not

    by_step: dict[int, float] = {}
    for record in read_metrics(train_path):
        if record.get("step") is not None and isinstance(record.get(metric), float | int):
            by_step[int(record["step"])] = float(record[metric])
    steps = sorted(by_step)
    return [(step + 1) * tokens_per_step for step in steps], [by_step[step] for step in steps]


class RungOutputError(ValueError):
    """A rung's train or evaluate output lacks what the fit reads; the message names the rung and the file."""


def _rung_results(rung: LadderRung, where: str) -> dict:
    path = storage.join(rung.evaluate_path, "results.json")
    rerun = f"rerun rung {rung.name}'s evaluate step (--force_run its name)"
    try:
        results = storage.read_json(path)
    except ValueError as error:  # json's errors (an empty or cut file) are ValueErrors
        raise RungOutputError(f"{where}: rung {rung.name}'s {path} is empty or not JSON ({error}); {rerun}") from error
    if results is None:
        raise FileNotFoundError(f"{where}: rung {rung.name} has no results.json at {path}; run its evaluate step first")
    if not isinstance(results, dict) or "macro_loss" not in results:
        raise RungOutputError(f"{where}: rung {rung.name}'s {path} holds no macro_loss; {rerun}")
    return results


def _rung_curve(rung: LadderRung, where: str, metric: str = MACRO_LOSS) -> RungCurve:
    results = _rung_results(rung, where)
    if (metric == SUITE_MACRO_LOSS) != (results.get("metric") == "eval_suite"):
        raise ValueError(f"{where}: rung {rung.name}'s results.json ({rung.evaluate_path}) scores "
                         f"{results.get('metric', 'components')} but the ladder reads {metric} during training: "
                         "give its evaluate step the train step's eval suite, or fit the metric it has")  # fmt: skip
    final_loss = float(results["macro_loss"])
    check_finite_losses(where, rung.name, storage.join(rung.evaluate_path, "results.json"), ["the end"], [final_loss])
    tokens, losses = eval_curve(rung.train_path, rung.tokens_per_step, metric)
    kept = [(t, loss) for t, loss in zip(tokens, losses, strict=True) if t < rung.tokens]
    metrics_file = storage.join(rung.train_path, "metrics.jsonl")
    if not kept:
        # One point (the end) gives no curve: the prediction would collapse to a single point, silently.
        found = "has no" if not storage.exists(metrics_file) else f"has no {metric} line before the run's end in"
        raise RungOutputError(
            f"{where}: rung {rung.name} {found} {metrics_file}, so its loss curve is missing; rerun its train "
            "step (--force_run its name), with steps_per_eval below num_train_steps"
        )
    eval_steps = [f"step {round(t / rung.tokens_per_step) - 1}" for t, _ in kept]  # the step as logged
    check_finite_losses(where, rung.name, metrics_file, eval_steps, [loss for _, loss in kept])
    tokens = [t for t, _ in kept] + [rung.tokens]
    losses = [loss for _, loss in kept] + [final_loss]
    return RungCurve(name=rung.name, compute=rung.flops, tokens=tokens, loss=losses)


def predict_from_ladder(config: LadderConfig) -> dict:
    """The scaling step: writes and returns prediction.json's content."""
    where = f"scaling step at {config.output_path}"
    needed = (MIN_RUNGS_FIXED if config.asymptote is not None else MIN_RUNGS_FREE) + 1  # one more for the band
    if len(config.rungs) < needed:
        raise ValueError(
            f"{where}: {len(config.rungs)} rung(s) cannot fit a power law with a band; give at least {needed}"
        )
    rungs = [_rung_curve(rung, where, config.metric) for rung in config.rungs]
    compute = [rung.compute for rung in rungs]
    final = [float(rung.loss[-1]) for rung in rungs]
    try:
        fit = fit_power_law(compute, final, config.asymptote)
    except ValueError as error:
        raise ValueError(f"{where}: cannot fit the rungs' losses {final} at FLOPs {compute}: {error}") from error
    check_fit(where, fit, compute, final)
    target = config.target
    prediction = predict_with_band(compute, final, target.flops, config.asymptote, samples=config.bootstrap_samples)
    # The curve starts where every rung has been evaluated at least once (at 10% of the run at the earliest) and
    # always has CURVE_POINTS points: a ladder evaluated late draws its curve closer together, never shorter.
    first = max(0.1, *(rung.tokens[0] / rung.tokens[-1] for rung in rungs))
    fractions = [float(f) for f in np.linspace(first, 1.0, CURVE_POINTS)]
    # Along the curve the irreducible loss is the final fit's: the loss at any fraction of training tends to the
    # same E as compute grows. Fixing it makes each of the curve's fits a closed-form line with a closed-form band.
    curve = predict_loss_curve(rungs, target.flops, target.tokens, fit.asymptote, fractions=fractions)
    document = prediction_document(fit, prediction, curve, rungs)
    for point in document["curve"]:
        # The step Levanter logs once the target has seen these tokens (it counts completed steps from 0), so
        # the run view draws the prediction on the same axis as the run's own eval lines.
        point["step"] = point["tokens"] / target.tokens_per_step - 1
    for entry, rung in zip(document["rungs"], rungs, strict=True):
        entry["tokens"] = rung.tokens[-1]
        entry["curve"] = [{"tokens": t, "loss": loss} for t, loss in zip(rung.tokens, rung.loss, strict=True)]
    document["warnings"] = fit_warnings(fit, prediction, min(final), fixed_asymptote=config.asymptote is not None)
    for warning in document["warnings"]:
        logger.warning("%s: %s", where, warning)
    document["target"] = {"name": target.name, "compute": target.flops, "tokens": target.tokens,
                          "tokens_per_step": target.tokens_per_step}  # fmt: skip
    storage.write_atomic(storage.join(config.output_path, "fit.png"), plot_fit(compute, final, fit, prediction))
    storage.write_json_atomic(storage.join(config.output_path, PREDICTION_FILE), document)
    logger.info("%s: L = %.4g + %.4g * C^-%.4g over %d rungs; %s predicted %.4f [%.4f, %.4f]", where,
                fit.asymptote, fit.A, fit.alpha, len(rungs), target.name, prediction.loss, prediction.low,
                prediction.high)  # fmt: skip
    return document
