"""The scaling fit: recovers a known law, bands that hold the next run as often as they say, a predicted loss curve
that never rises, eval lines read at the tokens they saw, and fits it cannot make refused."""

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from steps.scaling.scaling import (
    RungCurve,
    fit_power_law,
    non_increasing,
    plot_fit,
    predict_loss_curve,
    predict_with_band,
    prediction_document,
)

TRUE_A, TRUE_ALPHA, TRUE_E = 1200.0, 0.155, 1.72
LADDER_COMPUTE = np.array([5.5e19, 2.7e20, 1.8e21, 9.2e21])
HERO_COMPUTE = 2.7e24


def law(compute: np.ndarray | float) -> np.ndarray | float:
    return TRUE_E + TRUE_A * np.power(compute, -TRUE_ALPHA)


def test_fixed_asymptote_fit_is_the_log_linear_least_squares() -> None:
    fit = fit_power_law(LADDER_COMPUTE, law(LADDER_COMPUTE), asymptote=TRUE_E)
    assert fit.A == pytest.approx(TRUE_A, rel=1e-9)
    assert fit.alpha == pytest.approx(TRUE_ALPHA, rel=1e-9)
    assert fit.asymptote == TRUE_E
    assert fit.rms_log_residual < 1e-9


def test_free_asymptote_recovers_all_three_within_one_percent() -> None:
    compute = np.logspace(18, 22, 6)
    fit = fit_power_law(compute, law(compute))
    assert fit.asymptote == pytest.approx(TRUE_E, rel=0.01)
    assert fit.A == pytest.approx(TRUE_A, rel=0.01)
    assert fit.alpha == pytest.approx(TRUE_ALPHA, rel=0.01)
    assert float(fit.predict(HERO_COMPUTE)) == pytest.approx(float(law(HERO_COMPUTE)), rel=1e-3)


def test_band_is_zero_on_an_exact_law_and_opens_under_noise() -> None:
    exact = predict_with_band(LADDER_COMPUTE, law(LADDER_COMPUTE), HERO_COMPUTE, asymptote=TRUE_E, samples=100)
    assert exact.low == pytest.approx(exact.loss, rel=1e-9) and exact.high == pytest.approx(exact.loss, rel=1e-9)
    assert exact.loss == pytest.approx(float(law(HERO_COMPUTE)), rel=1e-9)

    rng = np.random.default_rng(7)
    noisy = law(LADDER_COMPUTE) * (1 + rng.normal(0, 0.003, size=len(LADDER_COMPUTE)))
    prediction = predict_with_band(LADDER_COMPUTE, noisy, HERO_COMPUTE, asymptote=TRUE_E, samples=300)
    assert prediction.low < prediction.loss < prediction.high
    # Three decades of extrapolation from four rungs with 0.3% noise: still within 1% of the law.
    assert prediction.loss == pytest.approx(float(law(HERO_COMPUTE)), rel=0.01)


def test_a_90_percent_band_holds_the_next_run_90_percent_of_the_time() -> None:
    """400 simulated ladders of four rungs with 2% noise on log(L - E), each with a noisy hero drawn from the same
    law: the fixed asymptote's band holds the hero in 85-95% of them (resampling rungs held it in 78%)."""
    rng = np.random.default_rng(1)
    held = 0
    for _ in range(400):
        rungs = TRUE_E + TRUE_A * LADDER_COMPUTE**-TRUE_ALPHA * np.exp(rng.normal(0, 0.02, len(LADDER_COMPUTE)))
        hero = TRUE_E + TRUE_A * HERO_COMPUTE**-TRUE_ALPHA * np.exp(rng.normal(0, 0.02))
        prediction = predict_with_band(LADDER_COMPUTE, rungs, HERO_COMPUTE, asymptote=TRUE_E)
        held += prediction.low <= hero <= prediction.high
    assert 0.85 <= held / 400 <= 0.95, held / 400


def test_the_free_asymptote_band_refits_every_rung_in_every_draw() -> None:
    """Resampling rungs gave exact three-point fits (zero residual) in 56% of draws on four rungs and threw a third
    away; the residual bootstrap keeps all four rungs in each of its draws, so none is thrown away."""
    from steps.scaling.scaling import residual_bootstrap

    rng = np.random.default_rng(3)
    noisy = law(LADDER_COMPUTE) * np.exp(rng.normal(0, 0.01, len(LADDER_COMPUTE)))
    fit = fit_power_law(LADDER_COMPUTE, noisy)
    draws = residual_bootstrap(LADDER_COMPUTE, noisy, HERO_COMPUTE, fit, samples=60)
    assert len(draws) == 60 and np.all(np.isfinite(draws))
    prediction = predict_with_band(LADDER_COMPUTE, noisy, HERO_COMPUTE, samples=60)
    assert prediction.low < prediction.loss < prediction.high
    with pytest.raises(ValueError, match=r"3 rung.* for 3 parameters .* give at least 4"):
        predict_with_band(LADDER_COMPUTE[:3], noisy[:3], HERO_COMPUTE)
    with pytest.raises(ValueError, match=r"2 rung.* for 2 parameters .* give at least 3"):
        predict_with_band(LADDER_COMPUTE[:2], noisy[:2], HERO_COMPUTE, asymptote=TRUE_E)


def test_non_increasing_is_the_nearest_curve_that_never_rises() -> None:
    assert non_increasing([3.0, 1.0, 2.0, 0.0]) == [3.0, 1.5, 1.5, 0.0]
    assert non_increasing([1.0, 2.0, 3.0]) == [2.0, 2.0, 2.0]
    assert non_increasing([5.0, 4.0]) == [5.0, 4.0]


def test_the_predicted_curve_never_rises_even_when_the_rungs_evals_do() -> None:
    """Every rung's eval at 60% of training is noisier (higher) than at 50%: fitted fraction by fraction, the target's
    predicted loss rose there (as the tiny demo's did, 6.496 at step 24 to 6.567 at step 42); the curve the run view
    draws is the nearest one that never rises."""
    fractions = np.linspace(0.1, 1.0, 10)
    rungs = []
    for index, compute in enumerate(LADDER_COMPUTE):
        losses = [float(law(fraction * compute)) for fraction in fractions]
        losses[5] += 0.2  # the eval at 60%
        rungs.append(RungCurve(name=f"d{index}", compute=float(compute), tokens=list(fractions * 1e9), loss=losses))
    curve = predict_loss_curve(rungs, HERO_COMPUTE, 18e12, asymptote=TRUE_E, fractions=list(fractions))
    losses = [point.loss for point in curve]
    assert all(later <= earlier for earlier, later in itertools.pairwise(losses)), losses
    assert curve[0].loss > curve[-1].loss
    # Away from the bump the points are the fits' own, bands included; the last is the final prediction.
    final = predict_with_band(LADDER_COMPUTE, [rung.loss[-1] for rung in rungs], HERO_COMPUTE, asymptote=TRUE_E)
    assert (curve[-1].loss, curve[-1].low, curve[-1].high) == pytest.approx((final.loss, final.low, final.high))
    assert all(point.low < point.loss < point.high for point in curve)


def test_predicted_loss_curve_follows_the_law_at_each_fraction() -> None:
    # A rung's loss at fraction f of its run behaves as a run of f times its compute.
    fractions = np.linspace(0.05, 1.0, 20)
    rungs = [
        RungCurve(
            name=f"d{index}",
            compute=float(compute),
            tokens=list(fractions * 1e9 * (index + 1)),
            loss=[float(law(fraction * compute)) for fraction in fractions],
        )
        for index, compute in enumerate(LADDER_COMPUTE)
    ]
    curve = predict_loss_curve(
        rungs, HERO_COMPUTE, target_tokens=18e12, asymptote=TRUE_E, fractions=[0.2, 0.5, 1.0], samples=20
    )
    assert [point.compute for point in curve] == pytest.approx([0.2 * 18e12, 0.5 * 18e12, 18e12])
    for fraction, point in zip([0.2, 0.5, 1.0], curve, strict=True):
        assert point.loss == pytest.approx(float(law(fraction * HERO_COMPUTE)), rel=1e-3)
    assert curve[0].loss > curve[1].loss > curve[2].loss

    fit = fit_power_law(LADDER_COMPUTE, [rung.loss[-1] for rung in rungs], asymptote=TRUE_E)
    document = prediction_document(fit, curve[-1], curve, rungs)
    assert [rung["name"] for rung in document["rungs"]] == ["d0", "d1", "d2", "d3"]
    assert document["curve"][-1]["tokens"] == pytest.approx(18e12)


def test_plot_is_a_png() -> None:
    fit = fit_power_law(LADDER_COMPUTE, law(LADDER_COMPUTE), asymptote=TRUE_E)
    prediction = predict_with_band(LADDER_COMPUTE, law(LADDER_COMPUTE), HERO_COMPUTE, asymptote=TRUE_E, samples=10)
    png = plot_fit(LADDER_COMPUTE.tolist(), law(LADDER_COMPUTE).tolist(), fit, prediction)
    assert png.startswith(b"\x89PNG") and len(png) > 5_000


def test_fits_it_cannot_make_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 3 distinct"):
        fit_power_law([1e18, 1e19], [3.0, 2.9])
    with pytest.raises(ValueError, match="exceed the asymptote"):
        fit_power_law([1e18, 1e19], [3.0, 1.5], asymptote=2.0)
    with pytest.raises(ValueError, match="positive"):
        fit_power_law([0.0, 1e19, 1e20], [3.0, 2.5, 2.2])
    rung = RungCurve(name="d768", compute=1e19, tokens=[5e8, 1e9], loss=[3.0, 2.8])
    with pytest.raises(ValueError, match="d768 has no eval before 10%"):
        predict_loss_curve([rung, rung, rung], 1e24, 1e12, asymptote=1.0, fractions=[0.1])


def write_rung(root, name: str, compute: float, tokens: float, tokens_per_step: float, steps_per_eval: int):
    """A rung's train and evaluate outputs as the steps write them: metrics.jsonl with `eval/macro_loss` lines
    logged as Levanter does, at the step just completed counted from 0 (the line after `done` steps says
    `done - 1`; the loss there is the law's at done / total x the compute; a resumed run repeats a step, with a
    stale value first; the last eval is at the last step) and results.json with the final macro loss."""
    import json

    from steps.scaling.ladder_config import LadderRung

    train, evaluate = root / f"train-{name}", root / f"eval-{name}"
    train.mkdir()
    evaluate.mkdir()
    total_steps = int(tokens / tokens_per_step)
    lines = []
    for done in range(steps_per_eval, total_steps + 1, steps_per_eval):
        loss = float(law(compute * done / total_steps))
        if done == 2 * steps_per_eval:
            lines.append({"step": done - 1, "eval/macro_loss": loss + 5.0})  # the killed run's line: superseded
        lines.append({"step": done - 1, "eval/macro_loss": loss, "train/loss": loss + 0.1})
    (train / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (evaluate / "results.json").write_text(json.dumps({"macro_loss": float(law(compute))}))
    return LadderRung(name=name, train_path=str(train), evaluate_path=str(evaluate), flops=compute, tokens=tokens,
                      tokens_per_step=tokens_per_step)  # fmt: skip


def test_the_scaling_step_predicts_the_target_from_rung_outputs(tmp_path) -> None:
    import json

    from steps.scaling.ladder import predict_from_ladder
    from steps.scaling.ladder_config import LadderConfig, LadderTarget

    rungs = [
        write_rung(tmp_path, f"r{i}", c, tokens=1e6 * (i + 1), tokens_per_step=1e4, steps_per_eval=10)
        for i, c in enumerate(LADDER_COMPUTE)
    ]
    target = LadderTarget(name="hero", flops=HERO_COMPUTE, tokens=5e8, tokens_per_step=2e4)
    out = tmp_path / "scaling"
    document = predict_from_ladder(LadderConfig(rungs=rungs, target=target, output_path=str(out), asymptote=TRUE_E,
                                                bootstrap_samples=50))  # fmt: skip
    assert json.loads((out / "prediction.json").read_text()) == document
    assert (out / "fit.png").read_bytes().startswith(b"\x89PNG")
    assert document["prediction"]["loss"] == pytest.approx(law(HERO_COMPUTE), rel=1e-6)
    assert document["target"]["name"] == "hero"
    assert [rung["final_loss"] for rung in document["rungs"]] == pytest.approx(list(law(LADDER_COMPUTE)))
    # The curve: the target's loss at fraction f is the law's at f x its compute; steps are tokens / tokens_per_step.
    for point in document["curve"]:
        fraction = point["tokens"] / target.tokens
        assert point["step"] == pytest.approx(point["tokens"] / target.tokens_per_step - 1)  # as Levanter logs it
        assert point["loss"] == pytest.approx(law(HERO_COMPUTE * fraction), rel=5e-3)  # linear between evals
    # Each rung's curve ends at its evaluate step's loss; the stale line of the killed run is not in it.
    first = document["rungs"][0]["curve"]
    assert first[-1] == {"tokens": 1e6, "loss": pytest.approx(law(LADDER_COMPUTE[0]))}
    assert all(point["loss"] < law(LADDER_COMPUTE[0] * 0.05) for point in first)


def test_the_scaling_step_names_the_rung_without_results(tmp_path) -> None:
    from steps.scaling.ladder import predict_from_ladder
    from steps.scaling.ladder_config import LadderConfig, LadderTarget

    rungs = [
        write_rung(tmp_path, f"r{i}", c, tokens=1e6, tokens_per_step=1e4, steps_per_eval=10)
        for i, c in enumerate(LADDER_COMPUTE)
    ]
    (tmp_path / "eval-r1" / "results.json").unlink()
    target = LadderTarget(name="hero", flops=HERO_COMPUTE, tokens=5e8, tokens_per_step=2e4)
    with pytest.raises(FileNotFoundError, match=r"rung r1 has no results.json at .*eval-r1/results.json; run its"):
        predict_from_ladder(LadderConfig(rungs=rungs, target=target, output_path=str(tmp_path / "out")))
    # A band needs one rung more than the fit has parameters: 4 with a free asymptote, 3 with a fixed one.
    with pytest.raises(ValueError, match=r"3 rung.* cannot fit a power law with a band; give at least 4"):
        predict_from_ladder(LadderConfig(rungs=rungs[:3], target=target, output_path=str(tmp_path / "out")))
    with pytest.raises(ValueError, match=r"2 rung.* cannot fit a power law with a band; give at least 3"):
        predict_from_ladder(
            LadderConfig(rungs=rungs[:2], target=target, output_path=str(tmp_path / "out"), asymptote=TRUE_E)
        )


def test_an_eval_logged_at_step_s_saw_s_plus_1_steps_of_tokens(tmp_path) -> None:
    """Levanter logs the step just completed, from 0: the eval line at step 9 follows 10 steps. A rung's curve puts it
    at 10 x tokens_per_step (it was put at 9 x, one step early), and the last eval (at the run's last step, its
    total tokens) appears once, as the evaluate step's figure, not twice."""
    from steps.scaling.ladder import _rung_curve, eval_curve

    rung = write_rung(tmp_path, "r0", LADDER_COMPUTE[0], tokens=1e6, tokens_per_step=1e4, steps_per_eval=25)
    tokens, losses = eval_curve(rung.train_path, rung.tokens_per_step)
    assert tokens == [25e4, 50e4, 75e4, 100e4]
    assert losses == pytest.approx([law(LADDER_COMPUTE[0] * fraction) for fraction in (0.25, 0.5, 0.75, 1.0)])
    curve = _rung_curve(rung, "test")
    assert curve.tokens == [25e4, 50e4, 75e4, 1e6]
    assert curve.loss[-1] == pytest.approx(law(LADDER_COMPUTE[0]))


@pytest.mark.parametrize("scale", ["tiny", "full"])
def test_the_hero_dags_ladder_fixes_the_asymptote_below_every_loss_it_fits(scale: str) -> None:
    """The published method: `default_scaling` hands the scaling step the scale's irreducible loss (hashed), never
    a free asymptote, which on the tiny ladder ran to its lower bound (1.2e-30, alpha 0.01)."""
    from executor import VersionedValue
    from experiments import hero_535b

    chosen = hero_535b.tiny_scale() if scale == "tiny" else hero_535b.full_scale()
    config = hero_535b.build_dag(chosen).scaling.config
    assert config.asymptote == VersionedValue(chosen.irreducible_loss)
    assert 0 < chosen.irreducible_loss < math.log(chosen.vocab_size) / 2


def test_the_ladder_fits_the_eval_suites_macro_loss_not_the_cells(tmp_path) -> None:
    """With an eval suite the curve reads `eval/suite/macro_loss` and the final point the evaluate step's suite
    macro loss; the cells' `eval/macro_loss`, beside it in metrics.jsonl, is left alone. A ladder that reads one
    metric during training and finds the other at the end is refused, naming the rung and its file."""
    import json

    from steps.scaling.ladder import predict_from_ladder
    from steps.scaling.ladder_config import SUITE_MACRO_LOSS, LadderConfig, LadderTarget

    rungs = [
        write_rung(tmp_path, f"r{i}", c, tokens=1e6, tokens_per_step=1e4, steps_per_eval=25)
        for i, c in enumerate(LADDER_COMPUTE)
    ]
    for rung in rungs:
        metrics = Path(rung.train_path) / "metrics.jsonl"
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        lines = [{"step": line["step"], SUITE_MACRO_LOSS: line["eval/macro_loss"], "eval/macro_loss": 9.0}
                 for line in lines]  # fmt: skip
        metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
        results = Path(rung.evaluate_path) / "results.json"
        results.write_text(json.dumps({**json.loads(results.read_text()), "metric": "eval_suite"}))
    target = LadderTarget(name="hero", flops=HERO_COMPUTE, tokens=5e8, tokens_per_step=2e4)
    config = LadderConfig(rungs=rungs, target=target, output_path=str(tmp_path / "out"), asymptote=TRUE_E,
                          metric=SUITE_MACRO_LOSS)  # fmt: skip
    document = predict_from_ladder(config)
    assert document["prediction"]["loss"] == pytest.approx(law(HERO_COMPUTE), rel=1e-6)
    assert all(point["loss"] < 9.0 for rung in document["rungs"] for point in rung["curve"])
    with pytest.raises(ValueError, match=r"rung r0's results.json \(.*eval-r0\) scores eval_suite but the ladder "
                                         r"reads eval/macro_loss"):  # fmt: skip
        predict_from_ladder(dataclasses.replace(config, metric="eval/macro_loss"))
