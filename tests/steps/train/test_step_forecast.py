"""The step-time forecast beside the roofline bound (steps/train/step_time.py): its derived terms worked out by
hand on the bound's own small case, its two efficiencies refit to Marin's two published MFUs from today's plans,
and the dry run's hours taken from it."""

from __future__ import annotations

import dataclasses

import pytest
from test_step_time import RACKS, SHAPE, plan

from experiments import hero_535b
from experiments.eval_suite import PALOMA_SUBSETS
from steps.model.model_size import flops_per_token
from steps.train.hardware import HARDWARE
from steps.train.memory_model import MemoryEstimate
from steps.train.step_time import (
    FITTED_EFFICIENCY,
    PUBLISHED_MFU,
    Efficiency,
    estimate_step_time,
    fit_efficiency,
    forecast_step_time,
)


def test_the_forecasts_derived_terms_on_two_racks_are_the_hand_computed_ones() -> None:
    # Capacity 1.25: the slot grid computes a quarter more of the routed experts' FLOPs. Each device holds 0.6 GB of
    # weights and 0.3 GB of optimizer state, written at the slow link's 1 GB/s every 600 s.
    planned = dataclasses.replace(plan(), capacity_factor=1.25, memory=MemoryEstimate(6 * 10**8, 0, 3 * 10**8, 0))
    efficiency = Efficiency(matmul=0.5, all_to_all=0.25)
    forecast = forecast_step_time(SHAPE, planned, RACKS, steps=100, evals=10, eval_sequences=64,
                                  checkpoint_interval_s=600.0, efficiency=efficiency)  # fmt: skip
    bound = estimate_step_time(SHAPE, planned, RACKS)
    routed_share = 6 * 2 * 2 * 49_152 / flops_per_token(SHAPE)  # 2 layers x top-2 x a 49,152-weight expert
    compute = bound.matmul_s * (1 + routed_share * 0.25) / 0.5
    evals = 10 * (flops_per_token(SHAPE) / 3 * 64 * 100) / (8 * 1e12) / 100 / 0.5
    work = compute + bound.hbm_s + bound.all_to_all_s / 0.25 + max(0.0, bound.fsdp_s - compute) + evals
    step = work / (1 - 9e8 / 1e9 / 600)
    assert forecast.step_s == pytest.approx(step, rel=1e-12)
    assert forecast.mfu == pytest.approx(bound.model_flops_per_device / (step * 1e12), rel=1e-12)
    assert forecast.step_s > bound.step_s and forecast.mfu < bound.mfu
    assert sum(forecast.terms_s().values()) == pytest.approx(forecast.step_s, rel=1e-12)


def published_forecasts() -> list[tuple]:
    """The forecasts of the GB200 plans of the two rungs Marin published an MFU for, with that MFU."""
    scale = hero_535b.full_scale()
    rungs = {rung.name: rung for rung in (*scale.rungs, scale.hero)}
    sets = scale.topics * scale.quality_buckets + len(PALOMA_SUBSETS)
    return [(rungs[name].forecast(scale.recipe, sets), mfu) for name, mfu in PUBLISHED_MFU.items()]


def test_the_efficiencies_are_fitted_to_marins_two_published_mfus() -> None:
    points = published_forecasts()
    refit = fit_efficiency(points)
    assert refit.matmul == pytest.approx(FITTED_EFFICIENCY.matmul, rel=1e-3)
    assert refit.all_to_all == pytest.approx(FITTED_EFFICIENCY.all_to_all, rel=1e-3)
    for forecast, mfu in points:
        assert forecast.mfu == pytest.approx(mfu, rel=1e-3)  # the stated, rounded efficiencies give both back
        assert forecast.exposed_fsdp_s == 0  # the fit's linearity holds: no FSDP left exposed at either point
    with pytest.raises(ValueError, match="two measured points"):
        fit_efficiency(points[:1])


@pytest.mark.parametrize("hardware", sorted(HARDWARE))
def test_the_dry_run_prints_the_forecast_beside_the_bound_and_its_hours(hardware: str, capsys) -> None:
    scale = hero_535b.full_scale(HARDWARE[hardware])
    dag = hero_535b.build_dag(scale)
    hero_535b.print_totals(scale, dag)
    printed = capsys.readouterr().out
    assert printed.count("forecast (fitted to Marin's MFUs)") == 5
    for rung, _ in dag.trains.values():
        forecast = rung.forecast(dag.recipe, dag.eval_sets)
        assert forecast.step_s > forecast.bound.step_s, rung.name
        assert f"{rung.hours(forecast.mfu):,.1f} hours\n" in printed, rung.name
