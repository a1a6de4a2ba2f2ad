"""Step builders for the training half of a DAG: tokenized cells, train, evaluate and the scaling ladder.

A `Rung` is one training run of a ladder (a model shape, a batch size, a number of steps); a `Recipe`
holds what every rung of a ladder shares (optimizer, schedule, routing, how often to evaluate and
checkpoint). `default_train` / `default_evaluate` turn a rung into steps named after it
(`train/d768`, `evaluate/d768`), and `default_scaling` fits the rungs and predicts the target.

What changes a run's result is versioned (shape, steps, batch, optimizer, data); what only changes how
it is watched or laid out (eval and checkpoint cadence, microbatching, the accelerator's peak) is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from executor import THIS_OUTPUT_PATH, ExecutorStep, ResourceConfig, output_path_of, versioned
from steps.evaluate.evaluate_config import EvaluateConfig
from steps.model.model_size import MoeShape, active_params, total_params, training_flops
from steps.scaling.ladder_config import MACRO_LOSS, LadderConfig, LadderRung, LadderTarget
from steps.tokenize.configs import TokenizeConfig
from steps.train.hardware import Hardware, mfu_denominator
from steps.train.parallelism import ParallelismPlan, plan_parallelism
from steps.train.step_time import StepTimeForecast, eval_allowance_s, forecast_step_time
from steps.train.train_config import HeroHyperparameters, MoeHeuristic, TrainConfig


@dataclass(frozen=True)
class Rung:
    """One training run of a ladder."""

    name: str
    """The rung's label, in its steps' names (e.g. "d768")."""
    shape: MoeShape
    batch_size: int
    """Sequences per optimizer step."""
    steps: int
    """Optimizer steps."""
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    """What its train step asks the cluster for (accelerators on a real run)."""
    hardware: Hardware | None = None
    """The accelerators it is planned on (None: whatever runs it, unplanned: the tiny demo on CPU)."""
    devices: int = 1
    """Devices the run is planned on (with `hardware`); layout only, never versioned."""
    learning_rate: float | None = None
    """Its own peak learning rate (None: the recipe's; versioned either way)."""

    def plan(self, recipe: Recipe, training: bool = True) -> ParallelismPlan | None:
        """The parallelism and memory plan of its train step (its batch) or evaluate step (forward only, on the
        recipe's eval batch), with the recipe's expert capacity, on `hardware`; None without one."""
        if self.hardware is None:
            return None
        batch = self.batch_size if training else recipe.eval_batch_size
        return plan_parallelism(self.shape, batch, self.hardware, self.devices, training=training,
                                capacity_factor=recipe.capacity_factor, optimizer=recipe.optimizer)  # fmt: skip

    def hours(self, mfu: float) -> float | None:
        """Wall-clock hours of its training at `mfu` on its devices (None without hardware)."""
        if self.hardware is None:
            return None
        return self.flops / (mfu_denominator(self.hardware.peak_flops_per_device, self.devices) * mfu) / 3600

    def train_resources(self, recipe: Recipe, eval_sets: int) -> ResourceConfig:
        """What its train step asks for: `resources`, and on planned hardware an eval allowance that holds one of
        its evals (`eval_sets` sets of the recipe's eval batches; steps/train/step_time.py `eval_allowance_s`): an
        eval completes no step, so a gang's watch gives its progress phase (`progress.EVAL`) `eval_timeout_s`
        from its start, while training keeps the hang timeout between two steps."""
        if self.hardware is None or recipe.eval_batches is None or eval_sets == 0:
            return self.resources
        allowance = eval_allowance_s(self.shape, eval_sequences(recipe, eval_sets), self.hardware, self.devices)
        return dataclasses.replace(self.resources, eval_timeout_s=max(self.resources.eval_timeout_s, allowance))

    def forecast(self, recipe: Recipe, eval_sets: int) -> StepTimeForecast | None:
        """Its train step's expected step time beside the roofline bound (steps/train/step_time.py), with its
        recipe's evals of `eval_sets` sets and temporary checkpoints; None without planned hardware."""
        plan = self.plan(recipe)
        if plan is None or self.hardware is None:
            return None
        return forecast_step_time(self.shape, plan, self.hardware, steps=self.steps, evals=recipe.evals_per_run,
                                  eval_sequences=eval_sequences(recipe, eval_sets),
                                  checkpoint_interval_s=recipe.temporary_checkpoint_seconds)  # fmt: skip

    def hero_hyperparameters(self, recipe: Recipe) -> HeroHyperparameters | None:
        """The hero optimizer's settings for this rung under `recipe` (None: the recipe trains with AdamW)."""
        if recipe.optimizer != "hero":
            return None
        return recipe.heuristic.hyperparameters(self.tokens, self.batch_size * self.shape.seq_len, self.shape.d_model)

    def schedule(self, recipe: Recipe) -> tuple[float, str]:
        """(min_lr_ratio, lr_schedule) of its train step: the heuristic's under "hero", else the recipe's."""
        if recipe.optimizer == "hero":
            return recipe.heuristic.min_lr_ratio, recipe.heuristic.lr_schedule
        return recipe.min_lr_ratio, recipe.lr_schedule

    @property
    def tokens(self) -> int:
        return self.batch_size * self.steps * self.shape.seq_len

    @property
    def flops(self) -> float:
        return training_flops(self.shape, self.tokens)

    def figures(self) -> dict[str, float]:
        """What the plan reports for the rung's train step."""
        return {
            "total_params": total_params(self.shape),
            "active_params": active_params(self.shape),
            "tokens": self.tokens,
            "flops": self.flops,
        }


@dataclass(frozen=True)
class Recipe:
    """What every rung of a ladder shares."""

    learning_rate: float
    """Peak learning rate of a rung that names none of its own (`Rung.learning_rate`)."""
    warmup: float = 0.01
    min_lr_ratio: float = 0.1
    lr_schedule: str = "cosine"
    weight_decay: float = 0.1
    optimizer: str = "adamw"
    """"adamw" at `learning_rate`, or the hero's "hero" (steps/train/optimizer.py) at the rates `heuristic`
    derives for each rung from its own tokens, batch and width, on the heuristic's schedule."""
    heuristic: MoeHeuristic = field(default_factory=MoeHeuristic)
    """Where a "hero" rung's rates, beta2 and epsilon come from (steps/train/optimizer.py)."""
    router_bias_balancing: bool = True
    router_aux_loss_coef: float | None = None
    router_z_loss_weight: float = 1e-4
    capacity_factor: float | None = 1.15
    """Tokens an expert takes per sequence, as a multiple of a fair share (the hero's 1.15; None: dropless), in
    training, in the train steps' evals and in the evaluate steps (which also score dropless)."""
    router_combine: str = "softmax"
    """Gate of the chosen experts' outputs: "softmax" or the hero's "sigmoid" (steps/model/config.py)."""
    router_combine_sum: float = 1.0
    """What the chosen experts' weights sum to (the hero: 2.5)."""
    compute_dtype: str = "float32"
    """Compute precision over f32 master weights: "float32" or "bfloat16" (the full recipe)."""
    mixture_block_size: int = 2048
    evals_per_run: int = 10
    """Evaluations during each run (the predicted loss curve is read at these points)."""
    eval_batch_size: int = 8
    """Sequences per eval batch, in the train steps' periodic evals and the evaluate steps alike."""
    eval_batches: int | None = None
    """Eval batches per component or suite subset, in both (None: every validation sequence): the train step's
    curve and the evaluate step's final point read the same sequences, whatever the train batch."""
    checkpoints_per_run: int = 10
    temporary_checkpoint_seconds: float = 600.0
    peak_flops_per_device: float | None = None
    """Dense bf16 peak of one device the rungs run on, for MFU (None: not logged)."""


def eval_sequences(recipe: Recipe, eval_sets: int) -> int:
    """Sequences one eval of a run reads: the recipe's eval batches of each of `eval_sets` sets (0 where the
    recipe reads every validation sequence, `eval_batches` None: not known before the data exists)."""
    return eval_sets * (recipe.eval_batches or 0) * recipe.eval_batch_size


def _microbatch(plan: ParallelismPlan | None) -> int:
    """Levanter's `per_device_parallelism` for a plan: its microbatch, or -1 (the whole batch) without one."""
    return -1 if plan is None else plan.microbatch


def _remat(plan: ParallelismPlan | None) -> str:
    """The train step's remat policy for a plan: the plan's, or none (tiny CPU runs have memory to spare)."""
    return "none" if plan is None else plan.remat


def _mesh(plan: ParallelismPlan | None) -> dict[str, int] | None:
    """The step's device mesh for a plan: its data x expert mesh, or None (Levanter's default) without one."""
    return None if plan is None else dict(plan.mesh)


def versioned_unless_default(config_type: type, **values: Any) -> dict[str, Any]:
    """Config fields added after runs were made with their defaults (the combine rule, the compute dtype, the
    evaluate step's capacity factor):
    versioned only where a recipe changes them, so that those runs keep their hashes."""
    defaults = {spec.name: spec.default for spec in dataclasses.fields(config_type)}
    return {name: versioned(value) for name, value in values.items() if value != defaults[name]}


def default_tokenize_cells(cells: ExecutorStep, tokenizer: ExecutorStep, validation_fraction: float) -> ExecutorStep:
    """Every cell of a cells step tokenized by one step: `<cell>/train`, `<cell>/validation`, components.json."""
    return ExecutorStep(
        name="tokenized/cells",
        fn="steps.tokenize.tokenize:tokenize",
        description=f"Each cell into its own Levanter cache pair ({validation_fraction:.1%} held out)",
        config=TokenizeConfig(
            input_paths=[output_path_of(cells, "cells")],
            tokenizer_path=output_path_of(tokenizer),
            validation_fraction=versioned(validation_fraction),
            per_folder=versioned(True),
            raw_input=False,
            output_path=THIS_OUTPUT_PATH,
        ),
    )


def default_train(
    rung: Rung,
    recipe: Recipe,
    tokenizer: ExecutorStep,
    tokenized: ExecutorStep,
    weights: ExecutorStep,
    prediction: ExecutorStep | None = None,
    eval_suite: ExecutorStep | None = None,
    eval_sets: int = 0,
) -> ExecutorStep:
    """Train `rung` on the mixture `weights` over the cells in `tokenized`, evaluated on the cells' validation
    splits and `eval_suite`'s subsets (`eval_sets` of them in all, which size the gang's progress allowance on
    planned hardware: `Rung.train_resources`); watched against `prediction`."""
    every_eval = max(1, rung.steps // recipe.evals_per_run)
    min_lr_ratio, lr_schedule = rung.schedule(recipe)
    return ExecutorStep(
        name=f"train/{rung.name}",
        fn="steps.train.train:train",
        description=f"{rung.name}: {rung.shape.n_layers} layers, d={rung.shape.d_model}, {rung.steps} steps of "
        f"{rung.batch_size} x {rung.shape.seq_len} tokens",
        config=TrainConfig(
            shape=versioned(rung.shape),
            tokenizer_path=output_path_of(tokenizer),
            components={},
            components_path=output_path_of(tokenized),
            mixture_weights_path=output_path_of(weights),
            mixture_block_size=versioned(recipe.mixture_block_size),
            output_path=THIS_OUTPUT_PATH,
            num_train_steps=versioned(rung.steps),
            train_batch_size=versioned(rung.batch_size),
            learning_rate=versioned(recipe.learning_rate if rung.learning_rate is None else rung.learning_rate),
            warmup=versioned(recipe.warmup),
            min_lr_ratio=versioned(min_lr_ratio),
            lr_schedule=versioned(lr_schedule),
            weight_decay=versioned(recipe.weight_decay),
            router_aux_loss_coef=versioned(recipe.router_aux_loss_coef),
            router_bias_balancing=versioned(recipe.router_bias_balancing),
            router_z_loss_weight=versioned(recipe.router_z_loss_weight),
            capacity_factor=versioned(recipe.capacity_factor),
            **versioned_unless_default(
                TrainConfig,
                router_combine=recipe.router_combine,
                router_combine_sum=recipe.router_combine_sum,
                compute_dtype=recipe.compute_dtype,
                optimizer=recipe.optimizer,
                hero_hyperparameters=rung.hero_hyperparameters(recipe),
            ),
            seed=versioned(0),
            steps_per_eval=every_eval,
            max_eval_batches=recipe.eval_batches,
            eval_batch_size=recipe.eval_batch_size,
            eval_suite_path=None if eval_suite is None else output_path_of(eval_suite),
            checkpoint_every_steps=max(1, rung.steps // recipe.checkpoints_per_run),
            temporary_checkpoint_seconds=recipe.temporary_checkpoint_seconds,
            peak_flops_per_device=recipe.peak_flops_per_device,
            per_device_parallelism=_microbatch(rung.plan(recipe)),
            remat=_remat(rung.plan(recipe)),
            mesh=_mesh(rung.plan(recipe)),
            prediction_path=None if prediction is None else output_path_of(prediction),
        ),
        resources=rung.train_resources(recipe, eval_sets),
        # 2: the model holds local/global layer periods and latent experts, without QK-norm: checkpoints of
        # earlier runs have another tree and cannot be resumed.
        # 3: the router bias is read from the whole batch's excess histogram (steps/model/router_balance.py), not
        # averaged over microbatches' quantiles: another bias, so other losses; the router state's tree changed.
        # 4: that histogram's quantile is read at the midpoint rank, q x tokens + 1/2 (float rounding no longer
        # picks an end of an empty stretch): another bias, so other losses.
        code_version="4",
    )


def fork_of(run: ExecutorStep, step: int, name: str, **changes: Any) -> ExecutorStep:
    """A train step that starts from `run`'s checkpoint at `step` with `changes` to its config (a fork, or a
    rollback past a spike): its own content-hashed step, whose lineage the run view draws.

        rollback = fork_of(hero, step=12_000, name="train/hero-rollback", learning_rate=versioned(2e-4))
        # past a spike: never train on the parent's batches 12,001-12,040, step t reads batch t + 40 after them
        skipping = fork_of(hero, step=12_000, name="train/hero-skip", skip_batches=versioned(((12_001, 12_041),)))
    """
    if not isinstance(run.config, TrainConfig):
        raise TypeError(f"fork_of: {run.name} is not a train step (its config is {type(run.config).__name__})")
    config = dataclasses.replace(run.config, initialize_from=output_path_of(run, f"checkpoints/step-{step}"), **changes)
    description = f"fork of {run.name} at step {step}" + (f": {', '.join(sorted(changes))}" if changes else "")
    return ExecutorStep(name=name, fn=run.fn, config=config, description=description, resources=run.resources,
                        code_version=run.code_version)  # fmt: skip


def default_evaluate(
    rung: Rung,
    recipe: Recipe,
    trained: ExecutorStep,
    tokenizer: ExecutorStep,
    tokenized: ExecutorStep,
    eval_suite: ExecutorStep | None = None,
) -> ExecutorStep:
    """Macro held-out loss and bits per byte of `trained`'s final checkpoint on `eval_suite` (the ladder's metric)
    and every cell's validation split, over the sequences the train step's own evals read."""
    return ExecutorStep(
        name=f"evaluate/{rung.name}",
        fn="steps.evaluate.evaluate:evaluate",
        description=f"{rung.name}: held-out loss per suite subset and per cell, and their macro averages",
        config=EvaluateConfig(
            checkpoint_path=output_path_of(trained, "checkpoints"),
            shape=versioned(rung.shape),
            tokenizer_path=output_path_of(tokenizer),
            components={},
            components_path=output_path_of(tokenized),
            output_path=THIS_OUTPUT_PATH,
            batch_size=recipe.eval_batch_size,
            max_batches=versioned(recipe.eval_batches),
            mesh=_mesh(rung.plan(recipe, training=False)),
            eval_suite_path=None if eval_suite is None else output_path_of(eval_suite),
            **versioned_unless_default(
                EvaluateConfig,
                router_combine=recipe.router_combine,
                router_combine_sum=recipe.router_combine_sum,
                capacity_factor=recipe.capacity_factor,
            ),
        ),
        resources=rung.resources,
    )


def default_scaling(
    rungs: Sequence[tuple[Rung, ExecutorStep, ExecutorStep]],
    target: Rung,
    asymptote: float,
    bootstrap_samples: int = 1000,
    metric: str = MACRO_LOSS,
) -> ExecutorStep:
    """Fit loss vs FLOPs over `rungs` (each with its train and evaluate steps) and predict `target`, by the
    published method: the irreducible loss E fixed at `asymptote`, A and alpha a least-squares line in log-log,
    the band least squares' prediction interval (steps/scaling/scaling.py). `metric`: the train steps' logged
    loss the curve reads (`SUITE_MACRO_LOSS` where the rungs have an eval suite)."""
    return ExecutorStep(
        name="scaling/ladder",
        fn="steps.scaling.ladder:predict_from_ladder",
        description=f"L(C) = {asymptote:g} + A C^-alpha over {len(rungs)} rungs -> {target.name} at "
        f"{target.flops:.2g} FLOPs",
        config=LadderConfig(
            rungs=[
                LadderRung(
                    name=rung.name,
                    train_path=output_path_of(trained),
                    evaluate_path=output_path_of(evaluated),
                    flops=versioned(rung.flops),
                    tokens=versioned(rung.tokens),
                    tokens_per_step=rung.batch_size * rung.shape.seq_len,
                )
                for rung, trained, evaluated in rungs
            ],
            target=versioned(
                LadderTarget(
                    name=target.name,
                    flops=target.flops,
                    tokens=target.tokens,
                    tokens_per_step=target.batch_size * target.shape.seq_len,
                )
            ),
            output_path=THIS_OUTPUT_PATH,
            asymptote=versioned(asymptote),
            bootstrap_samples=versioned(bootstrap_samples),
            **versioned_unless_default(LadderConfig, metric=metric),
        ),
    )
