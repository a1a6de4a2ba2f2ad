"""Held-out loss and bits per byte on the eval suite and per data component, from a train step's checkpoint.

    evaluation = ExecutorStep(
        name="evaluate/moe-tiny",
        fn=evaluate,
        config=EvaluateConfig(
            checkpoint_path=output_path_of(train_step, "checkpoints"),
            shape=versioned(tiny_shape),
            tokenizer_path=output_path_of(tokenizer),
            components={"prose": output_path_of(tokenized_prose), "code": output_path_of(tokenized_code)},
            output_path=THIS_OUTPUT_PATH,
        ),
    )

The ladder's metric is Paloma's: per held-out subset of the eval suite (steps/tokenize/eval_suite.py, text that
never entered training, each subset capped to the same tokens), the token-weighted mean loss, then the plain
mean over subsets (`macro_loss`), so that a large subset does not drown a small one. The data components'
validation splits (the training mixture's own cells) are scored the same way, as a second panel
(`components_macro_loss`); without a suite, `macro_loss` is theirs, as before. Bits per byte divide each
summed loss (in bits) by the UTF-8 bytes its target tokens decode to. Both come from Levanter's own
`TaggedEvaluator` (the code the train step's periodic `eval/suite/<subset>/loss`, `eval/<component>/loss` and
`/bpb` come from), reading the same sequences when `batch_size` x `max_batches` equals the train step's
`eval_batch_size` x `max_eval_batches`; this step only loads the latest complete checkpoint and averages.
At scale it loads the model on the plan's mesh (`mesh`, the train step's layout) and splits each batch over
every device.

A model trained with an expert capacity (`capacity_factor`, the hero's 1.15) is scored with it, as the train
step's own evals score it: each expert serves at most that many of each sequence's token copies, the rest are
dropped. `dropped_fraction` is the share of token -> expert assignments (K per token and MoE layer) past
capacity, over every scored sequence and per cache (a second pass, which skips the LM head). The same weights
are then scored without the cap, as `dropless` (Marin's `eval_dropless/`): what the model does when no token
is dropped. Under expert parallelism both send each device's slot grid, never a buffer of S x its copies
(steps/model/expert_parallel.py).

Output: `results.json` = {"checkpoint": path, "step": s, "metric": "eval_suite" or "components",
"suite": {subset: {"loss", "bpb"}}, "components": {name: {"loss", "bpb"}}, "macro_loss", "macro_bpb",
"components_macro_loss", "components_macro_bpb"}; with a capacity factor also "capacity_factor",
"dropped_fraction", a "dropped_fraction" beside each cache's loss, and "dropless": {"suite", "components",
"macro_loss", "macro_bpb", "components_macro_loss", "components_macro_bpb"}.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import haliax as hax
import jax
import jax.numpy as jnp
from haliax import Axis
from levanter.eval import EvalResult, LossFnOutput, TaggedEvaluator
from levanter.models.lm_model import LmExample, LmHeadModel
from levanter.trainer import TrainerConfig
from levanter.utils.tree_utils import inference_mode

from executor import storage
from steps.evaluate.checks import check_finite_results
from steps.evaluate.evaluate_config import EvaluateConfig
from steps.model.checkpoints import latest_checkpoint, load_model
from steps.model.levanter_config import lm_data_config, qwen3_moe_config, trainer_mesh
from steps.model.moe_model import dropped_share, with_capacity_factor
from steps.tokenize.eval_suite import SUITE_PREFIX, load_suite
from steps.tokenize.tokenize import load_components

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"


def evaluate(config: EvaluateConfig) -> dict:
    """The evaluate step: writes and returns results.json's content."""
    label = f"evaluate step {storage.basename(config.output_path)} ({config.output_path})"
    checkpoint = latest_checkpoint(config.checkpoint_path, label)
    model_config = qwen3_moe_config(
        config.shape,
        tokenizer_path=config.tokenizer_path,
        router_aux_loss_coef=None,
        router_combine=config.router_combine,
        router_combine_sum=config.router_combine_sum,
        capacity_factor=config.capacity_factor,
        step=label,
    )
    caches = dict(config.components)
    if config.components_path is not None:
        caches.update(load_components(config.components_path))
    if config.eval_suite_path is not None:
        caches.update(load_suite(config.eval_suite_path))
    if not caches:
        raise ValueError(f"{label}: no components to evaluate; give tokenize step outputs")
    data = lm_data_config(config.tokenizer_path, caches)
    trainer = _trainer(config, label)
    tagged_sets = [(data.validation_sets(model_config.max_Pos)[name], [name]) for name in caches]
    max_examples = config.max_batches * config.batch_size if config.max_batches is not None else None
    with trainer.use_device_mesh(), hax.axis_mapping(trainer.compute_axis_mapping):
        model = load_model(model_config, checkpoint, Axis("vocab", len(data.the_tokenizer)), trainer)

        def scored_by(loss_fn: Callable, tokenizer: Any = data.the_tokenizer) -> TaggedEvaluator:
            return TaggedEvaluator(
                EvalBatch=Axis("batch", config.batch_size),
                tagged_eval_sets=tagged_sets,
                loss_fn=loss_fn,
                tokenizer=tokenizer,
                axis_mapping=trainer.compute_axis_mapping,
                max_examples_per_dataset=max_examples,
            )

        scored = _scores(scored_by(_per_position_loss).evaluate(model), caches)
        results = {"checkpoint": checkpoint, "step": int(checkpoint.rstrip("/").rsplit("step-", 1)[-1])}
        if config.capacity_factor is not None:
            drops = scored_by(dropped_share, tokenizer=None).evaluate(model)
            for name in caches:
                scored[name]["dropped_fraction"] = float(drops.tag_micro_losses[name])
            dropless = _scores(scored_by(_per_position_loss).evaluate(with_capacity_factor(model, None)), caches)
            results |= _capacity_figures(config.capacity_factor, drops, dropless)
    results |= _macro_figures(scored)
    check_finite_results(label, results)
    storage.write_json_atomic(storage.join(config.output_path, RESULTS_FILE), results)
    logger.info("%s: macro loss %.4f, macro bpb %.4f", label, results["macro_loss"], results["macro_bpb"])
    return results


def _trainer(config: EvaluateConfig, label: str) -> TrainerConfig:
    """Levanter's trainer config for the evaluation's mesh: each device scores `batch_size / devices` sequences."""
    devices = jax.device_count()
    if config.batch_size <= 0 or config.batch_size % devices:
        raise ValueError(f"{label}: batch_size={config.batch_size} does not split over {devices} devices; "
                         "use a multiple of the device count")  # fmt: skip
    try:
        mesh = trainer_mesh(config.mesh, config.shape, devices)
    except ValueError as error:
        raise ValueError(f"{label}: {error}; fix the step's mesh") from error
    return TrainerConfig(require_accelerator=False, per_device_eval_parallelism=config.batch_size // devices, mesh=mesh)


def _scores(result: EvalResult, caches: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Each cache's loss and bits per byte."""
    assert result.tag_micro_bpb is not None  # TaggedEvaluator computes it whenever it has a tokenizer
    return {name: {"loss": float(result.tag_micro_losses[name]), "bpb": float(result.tag_micro_bpb[name])}
            for name in caches}  # fmt: skip


def _capacity_figures(capacity_factor: float, drops: EvalResult, dropless: dict[str, dict[str, float]]) -> dict:
    """results.json's figures of a capacity: the factor, the share of assignments dropped over every cache, and
    the dropless scores' panel."""
    panel = {name: value for name, value in _macro_figures(dropless).items() if name != "metric"}
    return {"capacity_factor": capacity_factor, "dropped_fraction": float(drops.micro_avg_loss), "dropless": panel}


def _macro_figures(scored: dict[str, dict[str, float]]) -> dict:
    """results.json's figures from every evaluated cache's: the suite's subsets and the components apart, each
    with its unweighted means; `macro_loss` / `macro_bpb` are the suite's where there is one."""
    suite = {name.removeprefix(SUITE_PREFIX): figures for name, figures in scored.items()
             if name.startswith(SUITE_PREFIX)}  # fmt: skip
    components = {name: figures for name, figures in scored.items() if not name.startswith(SUITE_PREFIX)}
    figures: dict = {"metric": "eval_suite" if suite else "components", "suite": suite, "components": components}
    if components:
        figures["components_macro_loss"], figures["components_macro_bpb"] = _means(components)
    figures["macro_loss"], figures["macro_bpb"] = _means(suite or components)
    return figures


def _means(group: dict[str, dict[str, float]]) -> tuple[float, float]:
    """The unweighted means of a group's losses and bits per byte."""
    return (sum(c["loss"] for c in group.values()) / len(group), sum(c["bpb"] for c in group.values()) / len(group))


def _per_position_loss(model: LmHeadModel, batch: LmExample) -> LossFnOutput:
    """Loss, weight and target token per position: what `TaggedEvaluator` sums per component and per byte."""
    model = inference_mode(model, True)
    per_pos_loss = model.compute_next_token_loss(batch, reduction=None, reduction_axis=()).array
    per_pos_token_id = jnp.roll(batch.tokens.array, -1, axis=-1)
    return per_pos_loss, batch.loss_weight.array, per_pos_token_id
