"""Evals in a progress phase of their own (steps/train/train.py `EVAL`), and a gang of stand-in members
whose eval outlasts the hang timeout that was the hero's whole progress allowance (600 s), watched by the
executor's own `progress.ProgressWatch` with the resources the hero's train step asks for: a slow first eval is
not called a stall, a member stuck for longer than the planned eval allowance still is."""

from __future__ import annotations

import dataclasses

from executor import progress
from experiments.eval_suite import PALOMA_SUBSETS
from experiments.hero_535b import Scale, build_dag, full_scale, tiny_scale
from experiments.train_defaults import Rung
from steps.train.step_time import EVAL_COMPILE_S, eval_allowance_s
from steps.train.train import EVAL, TRAINING, in_eval_phase

MEMBERS = 2


def test_an_eval_hook_runs_in_the_eval_phase_inside_training() -> None:
    seen: list[str | None] = []
    hook = in_eval_phase(lambda step: seen.append(progress.snapshot()["phase"]))
    progress.reset()
    with progress.phase(TRAINING):
        hook(10)
        after = progress.snapshot()["phase"]
    assert seen == [EVAL] and after == TRAINING


def planned_allowance(scale: Scale, rung: Rung) -> float:
    """The eval allowance of a full-scale rung: every cell's validation split and Paloma's subsets, each read for
    the recipe's eval batches."""
    sets = scale.topics * scale.quality_buckets + len(PALOMA_SUBSETS)
    sequences = sets * scale.recipe.eval_batches * scale.recipe.eval_batch_size
    return eval_allowance_s(rung.shape, sequences, rung.hardware, rung.devices)


def watch_of(resources) -> progress.ProgressWatch:
    """The gang driver's watch for a step with `resources` (executor/run/gang.py builds it the same way)."""
    return progress.ProgressWatch(resources.progress_timeout_s or resources.hang_timeout_s,
                                  resources.first_step_timeout_s, resources.checkpoint_timeout_s, now=0.0,
                                  eval_timeout_s=resources.eval_timeout_s)  # fmt: skip


def train_to_an_eval(watch: progress.ProgressWatch) -> float:
    """Every member completes steps 0..9 a second apart, then enters the eval after step 9; returns that time."""
    for step in range(10):
        for rank in range(MEMBERS):
            watch.heard(rank, {"step": step, "phase": TRAINING}, now=100.0 + step)
    for rank in range(MEMBERS):
        watch.heard(rank, {"step": 9, "phase": EVAL}, now=110.0)
    return 110.0


def test_a_stand_in_gang_whose_eval_outlasts_the_hang_timeout_is_not_called_a_stall() -> None:
    scale = full_scale()
    hero, step = build_dag(scale).trains["d6144"]
    resources, allowance = step.resources, planned_allowance(scale, hero)
    assert resources.eval_timeout_s == allowance > resources.checkpoint_timeout_s >= EVAL_COMPILE_S
    assert (resources.progress_timeout_s or resources.hang_timeout_s) == 600.0  # training keeps the hang timeout

    watch = watch_of(resources)
    started = train_to_an_eval(watch)
    # Compiling and running the first eval for longer than the hang timeout (and the checkpoint allowance) while
    # every member answers its heartbeat, as the stand-in members do here.
    for seconds in (resources.hang_timeout_s + 1, resources.checkpoint_timeout_s + 1, allowance - 1):
        for rank in range(MEMBERS):
            watch.heard(rank, {"step": 9, "phase": EVAL}, now=started + seconds)
        assert watch.stalled(now=started + seconds) is None, seconds
    # A member stuck past the plan's allowance is a stall still.
    assert "no member completed a step" in watch.stalled(now=started + allowance + 1)
    # A gang stuck while training (not in an eval) is still torn down after the hang timeout.
    stuck = watch_of(resources)
    for rank in range(MEMBERS):
        stuck.heard(rank, {"step": 9, "phase": TRAINING}, now=109.0)
    assert stuck.stalled(now=109.0 + resources.hang_timeout_s - 1) is None
    assert "no member completed a step" in stuck.stalled(now=109.0 + resources.hang_timeout_s + 1)
    # Without an eval allowance (a watch that gives the eval phase only the hang timeout) the gang was torn down.
    bare = progress.ProgressWatch(resources.hang_timeout_s, resources.first_step_timeout_s,
                                  resources.checkpoint_timeout_s, now=0.0)  # fmt: skip
    started = train_to_an_eval(bare)
    assert bare.stalled(now=started + resources.hang_timeout_s + 1) is not None


def test_every_planned_train_step_allows_its_eval_and_unplanned_ones_keep_their_resources() -> None:
    scale = full_scale()
    for rung, step in build_dag(scale).trains.values():
        assert step.resources.eval_timeout_s == planned_allowance(scale, rung), rung.name
        assert step.resources == dataclasses.replace(rung.resources, eval_timeout_s=planned_allowance(scale, rung))
    for rung, step in build_dag(tiny_scale()).trains.values():  # no hardware, no plan: as the rung asks
        assert step.resources == rung.resources, rung.name
