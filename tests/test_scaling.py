"""The scaling fit: recovers a known law, predicts a run's loss curve, and refuses fits it cannot make."""

import numpy as np
import pytest

from steps.scaling.scaling import (
    RungCurve,
    bootstrap_prediction,
    fit_power_law,
    plot_fit,
    predict_loss_curve,
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


def test_bootstrap_band_is_zero_on_an_exact_law_and_opens_under_noise() -> None:
    exact = bootstrap_prediction(LADDER_COMPUTE, law(LADDER_COMPUTE), HERO_COMPUTE, asymptote=TRUE_E, samples=100)
    assert exact.low == pytest.approx(exact.loss, rel=1e-9) and exact.high == pytest.approx(exact.loss, rel=1e-9)
    assert exact.loss == pytest.approx(float(law(HERO_COMPUTE)), rel=1e-9)

    rng = np.random.default_rng(7)
    noisy = law(LADDER_COMPUTE) * (1 + rng.normal(0, 0.003, size=len(LADDER_COMPUTE)))
    prediction = bootstrap_prediction(LADDER_COMPUTE, noisy, HERO_COMPUTE, asymptote=TRUE_E, samples=300)
    assert prediction.low < prediction.loss < prediction.high
    # Three decades of extrapolation from four rungs with 0.3% noise: still within 1% of the law.
    assert prediction.loss == pytest.approx(float(law(HERO_COMPUTE)), rel=0.01)


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
    prediction = bootstrap_prediction(LADDER_COMPUTE, law(LADDER_COMPUTE), HERO_COMPUTE, asymptote=TRUE_E, samples=10)
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
    (the loss at each fraction f of training is the law's at f x the compute; a resumed run repeats a step, with
    a stale value first) and results.json with the final macro loss."""
    import json

    from steps.scaling.ladder import LadderRung

    train, evaluate = root / f"train-{name}", root / f"eval-{name}"
    train.mkdir()
    evaluate.mkdir()
    total_steps = int(tokens / tokens_per_step)
    lines = []
    for step in range(steps_per_eval, total_steps, steps_per_eval):
        loss = float(law(compute * step / total_steps))
        if step == 2 * steps_per_eval:
            lines.append({"step": step, "eval/macro_loss": loss + 5.0})  # the killed run's line: superseded
        lines.append({"step": step, "eval/macro_loss": loss, "train/loss": loss + 0.1})
    (train / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (evaluate / "results.json").write_text(json.dumps({"macro_loss": float(law(compute))}))
    return LadderRung(name=name, train_path=str(train), evaluate_path=str(evaluate), flops=compute, tokens=tokens,
                      tokens_per_step=tokens_per_step)  # fmt: skip


def test_the_scaling_step_predicts_the_target_from_rung_outputs(tmp_path) -> None:
    import json

    from steps.scaling.ladder import LadderConfig, LadderTarget, predict_from_ladder

    rungs = [write_rung(tmp_path, f"r{i}", c, tokens=1e6 * (i + 1), tokens_per_step=1e4, steps_per_eval=10)
             for i, c in enumerate(LADDER_COMPUTE)]  # fmt: skip
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
        assert point["step"] == pytest.approx(point["tokens"] / target.tokens_per_step)
        assert point["loss"] == pytest.approx(law(HERO_COMPUTE * fraction), rel=5e-3)  # linear between evals
    # Each rung's curve ends at its evaluate step's loss; the stale line of the killed run is not in it.
    first = document["rungs"][0]["curve"]
    assert first[-1] == {"tokens": 1e6, "loss": pytest.approx(law(LADDER_COMPUTE[0]))}
    assert all(point["loss"] < law(LADDER_COMPUTE[0] * 0.05) for point in first)


def test_the_scaling_step_names_the_rung_without_results(tmp_path) -> None:
    from steps.scaling.ladder import LadderConfig, LadderTarget, predict_from_ladder

    rungs = [write_rung(tmp_path, f"r{i}", c, tokens=1e6, tokens_per_step=1e4, steps_per_eval=10)
             for i, c in enumerate(LADDER_COMPUTE[:3])]  # fmt: skip
    (tmp_path / "eval-r1" / "results.json").unlink()
    target = LadderTarget(name="hero", flops=HERO_COMPUTE, tokens=5e8, tokens_per_step=2e4)
    with pytest.raises(FileNotFoundError, match=r"rung r1 has no results.json .*eval-r1; run its evaluate step"):
        predict_from_ladder(LadderConfig(rungs=rungs, target=target, output_path=str(tmp_path / "out")))
    with pytest.raises(ValueError, match=r"2 rung.* cannot fit a power law; give at least 3"):
        predict_from_ladder(LadderConfig(rungs=rungs[:2], target=target, output_path=str(tmp_path / "out")))
