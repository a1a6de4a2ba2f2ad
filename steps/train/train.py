"""Train a mixture-of-experts LM with Levanter, in process, under the step's output path.

    train_step = ExecutorStep(
        name="train/moe-tiny",
        fn=train,
        config=TrainConfig(
            shape=versioned(tiny_shape),
            tokenizer_path=output_path_of(tokenizer),
            components={"prose": output_path_of(tokenized_prose), "code": output_path_of(tokenized_code)},
            num_train_steps=versioned(200),
            train_batch_size=versioned(8),
            output_path=THIS_OUTPUT_PATH,
        ),
        resources=ResourceConfig(gpus=1),
    )

The step translates its frozen config into Levanter's `TrainLmConfig` (model: `qwen3_moe` from the
`MoeShape`, steps/model/levanter_config.py; data: the tokenize steps' caches, never rebuilt) and calls
`levanter.main.train_lm.main`. Everything it writes lies under its output path:

- `checkpoints/`: Levanter checkpoints, temporary ones every `temporary_checkpoint_seconds` (only the latest
  is kept; they are what a preempted or killed run resumes from) and permanent ones every
  `checkpoint_every_steps`, plus the final one. Levanter writes a checkpoint's metadata last, so only
  complete checkpoints are found on resume. Rerunning the step (the executor does so after a failure)
  restores the latest (`step-N`: the state after step N) and continues at step N + 1, the data loader
  at the next batch.
- `metrics.jsonl`: every metric Levanter logs, with MFU from steps/model/model_size.py (steps/train/train_metrics.py).
- `wandb/`: wandb's offline run files (`wandb sync` uploads them); `logs/`: Levanter's log files.
- `lineage.json` (a fork only): the parent run and step it started from.
- `prediction_seal.json` (a run with a `prediction_path`): the prediction's sha256 and time, sealed at the start.
- `hf/`: the final checkpoint as an HF-style folder (config.json, model.safetensors, the tokenizer), which
  `steps.model.hf_export.load_hf_export` rebuilds exactly (`hf_export`).

A fork or rollback starts from another run's checkpoint: `initialize_from=output_path_of(parent,
"checkpoints/step-N")` (or `experiments/train_defaults.fork_of`) loads that state (weights, optimizer, step
counter, so the data loader continues at batch N + 1) when the fork has no checkpoint of its own yet; its
changed versioned settings (learning rate, mixture, seed...) apply from there. The checkpoint is a
dependency, so the fork is its own content-hashed step.

Bad input is refused before JAX compiles anything: a missing cache, a fork's missing checkpoint, a cache
tokenized with another vocabulary than the model's, a batch the devices cannot split. (A top-k above the
expert count cannot even be written: `MoeShape` refuses it.)

The process around the run (the module's last part): Levanter and wandb are configured through process-wide
state, environment variables (offline Hugging Face hub, wandb's mode and folder under the output path, a
temporary MARIN_PREFIX), wandb's one setup per process, the root logger's file handlers. The step wraps each run
in `training_environment`, which sets that state for the run alone and restores it after, so that several train
steps in one worker process (Ray runs many) never write into one another's files. Tools that write only local
files get a folder of the output path when it is local, or a temporary one that is uploaded to `<output>/<name>/`
when the output is on an object store (`local_dir`, `keep_local_folder`). A run also tells a gang's watch how far
it got (executor/run/gang_progress.py): it runs in phase `TRAINING`, each checkpoint save in phase "checkpoint"
(`checkpoint_saves_in_their_phase`) and each eval in phase `EVAL` (`in_eval_phase`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import jax
import levanter.eval
import levanter.tracker
import wandb
from haliax import Axis
from levanter.callbacks import StepInfo
from levanter.checkpoint import Checkpointer, CheckpointerConfig
from levanter.distributed import DistributedConfig
from levanter.eval import TaggedEvaluator
from levanter.main import train_lm
from levanter.optim.config import OptimizerConfig
from levanter.tracker import wandb as levanter_wandb
from levanter.trainer import TrainerConfig

from executor import progress, storage
from steps.model.checkpoints import check_checkpoints
from steps.model.config import REMAT_POLICIES
from steps.model.hf_export import HF_FOLDER, export_checkpoint
from steps.model.levanter_config import lm_data_config, qwen3_moe_config, trainer_mesh
from steps.model.model_size import flops_per_token
from steps.model.moe_model import MoeConfig, MoeWatchConfig, dropped_share
from steps.tokenize.eval_suite import load_suite
from steps.tokenize.mixture_weights import Schedule, phase_start
from steps.tokenize.tokenize import load_components
from steps.tokenize.train_tokenizer import load_tokenizer
from steps.train.data_order import TokensSeen, ordered
from steps.train.input_checks import (
    MIXTURE_FILE,
    TrainInputError,
    check_cache,
    checked_skips,
    damaged_checkpoint_set_aside,
    divergence_explained,
    excluded_cells,
    given_schedule,
    restarted,
    weights_file_schedule,
)
from steps.train.optimizer import (
    levanter_optimizer,
    write_optimizer_groups,
)
from steps.train.parallelism import precision_policy
from steps.train.train_config import TrainConfig
from steps.train.train_metrics import JsonlMetricsConfig, record_lineage, seal_prediction, wandb_config

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")


def train(config: TrainConfig) -> None:
    """The train step: checks its inputs, then runs Levanter's trainer under `training_environment`."""
    check_inputs(config)
    check_checkpoints(storage.join(config.output_path, "checkpoints"), _step_label(config))
    record_mixture(config)
    record_lineage(config.output_path, config.initialize_from)
    seal_prediction(config.output_path, config.prediction_path)
    record_optimizer_groups(config)
    with training_environment(config.output_path):
        run = levanter_config(config)
        try:
            label = _step_label(config)
            with (
                divergence_explained(label, config.output_path, config.learning_rate),
                damaged_checkpoint_set_aside(label, config.output_path),
                periodic_evals(config.capacity_factor, config.num_train_steps - 1),
                progress.phase(TRAINING),
                checkpoint_saves_in_their_phase(),
            ):
                train_lm.main(run)
            if config.hf_export:
                hf_folder = storage.join(config.output_path, HF_FOLDER)
                checkpoints = run.trainer.checkpointer.base_path
                export_checkpoint(checkpoints, run.model, config.shape.vocab_size, hf_folder, trainer=run.trainer)
        finally:
            close_log_files(run.trainer.log_dir)
            keep_local_folder(str(run.trainer.log_dir), config.output_path, "logs")


@contextmanager
def periodic_evals(capacity_factor: float | None, last_step: int) -> Iterator[None]:
    """Levanter's periodic eval, once a step, and with an expert capacity the share of assignments the final one
    dropped.

    Once a step: Levanter runs every hook again, forced, after the last step, so a run whose last step is an eval
    step (100 steps, an eval every 20) evaluated its final model twice, the same figures logged twice at one step.
    With an expert capacity, the eval of the final model (`last_step`) also logs the share of expert assignments
    it dropped: `eval/dropped_fraction` over every eval set and `eval/<tag>/dropped_fraction` per set, the figures
    the evaluate step writes to results.json (`dropped_share`, on the same sequences). It costs one more forward
    pass (without the LM head) per eval batch, about as long as the eval itself, so the evals before the last
    leave it to the train step's own `router/dropped_fraction`. Levanter's `train_lm` builds its eval callback
    itself, so its builder is wrapped for the length of the run."""
    build = levanter.eval.cb_tagged_lm_evaluate

    def once_a_step(*args: Any, **kwargs: Any) -> Callable[[StepInfo], None]:
        scores = build(*args, **kwargs)
        drops = None if capacity_factor is None else _drops_evaluator(build, args, kwargs)
        last_evaluated: int | None = None

        @in_eval_phase
        def evaluate(step: StepInfo) -> None:
            nonlocal last_evaluated
            if step.step == last_evaluated:
                return  # the forced run of the hooks after the last step, which the periodic run just evaluated
            last_evaluated = step.step
            scores(step)
            if drops is not None and step.step == last_step:
                result = drops.evaluate(step.model)
                shares = result.tag_micro_losses.items()
                figures = {f"eval/{tag}/dropped_fraction": float(share) for tag, share in shares}
                levanter.tracker.log({"eval/dropped_fraction": float(result.micro_avg_loss), **figures}, step=step.step)

        return evaluate

    levanter.eval.cb_tagged_lm_evaluate = once_a_step
    try:
        yield
    finally:
        levanter.eval.cb_tagged_lm_evaluate = build


def _drops_evaluator(build: Callable[..., Any], args: tuple, kwargs: dict) -> TaggedEvaluator:
    """An evaluator over the eval callback's sets (`build(*args, **kwargs)`'s) whose loss is the dropped share."""
    given = inspect.signature(build).bind(*args, **kwargs).arguments
    mp = given.get("mp")

    def loss_fn(model: Any, batch: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        return dropped_share(model if mp is None else mp.cast_to_compute(model), batch)

    return TaggedEvaluator(
        EvalBatch=given["EvalBatch"],
        tagged_eval_sets=given["tagged_eval_sets"],
        loss_fn=loss_fn,
        tokenizer=None,
        device_mesh=given.get("device_mesh"),
        axis_mapping=given.get("axis_mapping"),
        max_examples_per_dataset=given.get("max_examples_per_dataset"),
    )


COMPILE_ONCE_BELOW_STEPS = 1000
"""`TrainConfig.compile_once`'s default: runs shorter than this compile one train step (a tiny CPU run's second
compile is ~10 s of its ~60), longer ones Levanter's two (the watch costs a little in every step it is in)."""


def _watch(config: TrainConfig) -> MoeWatchConfig:
    if not 0 < config.watch_interval <= config.num_train_steps:  # never fires: Levanter compiles only the step without
        return MoeWatchConfig(interval=config.watch_interval)
    once = config.compile_once
    if once is None:
        once = config.num_train_steps < COMPILE_ONCE_BELOW_STEPS
    every = config.watch_interval
    return MoeWatchConfig.compile_once(every) if once else MoeWatchConfig(interval=every)


def _step_label(config: TrainConfig) -> str:
    return f"train step {storage.basename(config.output_path)} ({config.output_path})"


def check_inputs(config: TrainConfig) -> None:
    """Refuse, naming the step, what would fail (or silently mis-train) once Levanter has started."""
    label = _step_label(config)
    try:
        config.check_settings()
    except TrainInputError as error:
        raise TrainInputError(f"{label}: {error}; fix the step's config") from error
    if config.initialize_from is not None and not storage.exists(storage.join(config.initialize_from, "metadata.json")):
        raise TrainInputError(
            f"{label}: initialize_from={config.initialize_from} is not a complete checkpoint (no metadata.json); "
            "fork from a step the parent run checkpointed (its checkpoints/step-N folders)"
        )
    devices = jax.device_count()
    microbatch = config.per_device_parallelism * devices if config.per_device_parallelism > 0 else devices
    if config.eval_batch_size is not None and (config.eval_batch_size <= 0 or config.eval_batch_size % devices):
        raise TrainInputError(f"{label}: eval_batch_size={config.eval_batch_size} does not split over {devices} "
                              "devices; use a multiple of the device count")  # fmt: skip
    if config.train_batch_size <= 0 or config.train_batch_size % microbatch:
        raise TrainInputError(
            f"{label}: train_batch_size={config.train_batch_size} does not split into microbatches of "
            f"{microbatch} sequences ({devices} devices x per_device_parallelism={config.per_device_parallelism}); "
            "use a multiple of it"
        )
    if config.remat not in REMAT_POLICIES:
        raise TrainInputError(f"{label}: remat={config.remat!r} is none of {REMAT_POLICIES}; fix the step's config")
    try:
        precision_policy(config.compute_dtype)
        trainer_mesh(config.mesh, config.shape, devices)
    except ValueError as error:
        raise TrainInputError(f"{label}: {error}; fix the step's config") from error
    components, _ = data_mixture(config)
    checked_skips(label, config.skip_batches)
    try:
        tokenizer_vocab = load_tokenizer(config.tokenizer_path).get_vocab_size()
    except ValueError as error:  # a damaged tokenizer.json: named with the file, and with this step here
        raise TrainInputError(f"{label}: {error}") from error
    if tokenizer_vocab != config.shape.vocab_size:
        raise TrainInputError(
            f"{label}: the tokenizer at {config.tokenizer_path} has {tokenizer_vocab} tokens but the model shape "
            f"says vocab_size={config.shape.vocab_size}; make them equal"
        )
    train_only = train_only_components(config)
    evaluated_only = suite_components(config)
    for name, path in components.items():
        for split in SPLITS[:1] if name in train_only else SPLITS[1:] if name in evaluated_only else SPLITS:
            sequence = config.shape.seq_len if split == "train" else 1  # the mixture samples whole sequences
            check_cache(label, name, storage.join(path, split), tokenizer_vocab, sequence)


def train_only_components(config: TrainConfig) -> set[str]:
    """The per-folder tokenize output's components without validation documents: trained on, not evaluated."""
    if config.components_path is None:
        return set()
    return set(load_components(config.components_path, train_only=True)) - set(config.components)


def suite_components(config: TrainConfig) -> dict[str, str]:
    """The eval suite's subsets as validation-only components (`suite/<subset>` -> cache folder)."""
    return {} if config.eval_suite_path is None else load_suite(config.eval_suite_path)


def data_mixture(config: TrainConfig) -> tuple[dict[str, str], Schedule]:
    """The components (given ones, a per-folder tokenize output's, the eval suite's) and the weight schedule
    `[(start_step, {component: weight}), ...]` the run trains on; refused with TrainInputError if unusable. The
    suite's subsets get no weight: Levanter evaluates them and never trains on them."""
    components, schedule, _ = _mixture(config)
    return {**components, **suite_components(config)}, schedule


def _mixture(config: TrainConfig) -> tuple[dict[str, str], Schedule, dict[str, list[float]]]:
    """`data_mixture`, plus the weights (per phase) dropped because tokenize left their cells out."""
    label = _step_label(config)
    components = dict(config.components)
    if config.components_path is not None:
        components.update(load_components(config.components_path))
        components.update(load_components(config.components_path, train_only=True))
    if not components:
        raise TrainInputError(f"{label}: no data components; give at least one tokenize step output")
    if config.mixture_weights_path is None:
        if config.weights is None:
            return components, [(0, dict.fromkeys(components, 1.0))], {}
        return components, given_schedule(label, config.weights, components), {}

    def phase_start_step(fraction_before: float) -> int:
        return phase_start(config.num_train_steps, fraction_before, config.train_batch_size, config.mixture_block_size)

    schedule, dropped = weights_file_schedule(label, config.mixture_weights_path, components,
                                              excluded_cells(config.components_path), phase_start_step)  # fmt: skip
    return components, restarted(label, schedule, config.phase_steps), dropped


def record_mixture(config: TrainConfig) -> None:
    """Write `mixture.json` (the schedule trained on, the weights dropped, the block and batch sizes the served
    shares are held to: executor/watch/training/served_mixture.py) and warn, by name, of each dropped cell."""
    _, schedule, dropped = _mixture(config)
    if dropped:
        logger.warning("%s: weights on cells that tokenize left out are dropped (per phase): %s; the other "
                       "components' weights are renormalised", _step_label(config), dropped)  # fmt: skip
    record = {"schedule": [[start, weights] for start, weights in schedule], "dropped": dropped,
              "block_size": config.mixture_block_size, "batch_size": config.train_batch_size}  # fmt: skip
    storage.write_json_atomic(storage.join(config.output_path, MIXTURE_FILE), record)


def levanter_config(config: TrainConfig) -> train_lm.TrainLmConfig:
    """Our config as Levanter's `TrainLmConfig`: every path under the step's output."""
    run_id = storage.basename(config.output_path)
    label = _step_label(config)
    components, schedule = data_mixture(config)
    data = ordered(
        lm_data_config(config.tokenizer_path, components, schedule, config.mixture_block_size,
                       train_only=train_only_components(config)),
        skip_steps=checked_skips(label, config.skip_batches),
        max_epochs=config.max_epochs,
        num_train_steps=config.num_train_steps,
        where=label,
    )  # fmt: skip
    trackers = (
        JsonlMetricsConfig(
            output_path=config.output_path,
            flops_per_token=flops_per_token(config.shape),
            peak_flops_per_device=config.peak_flops_per_device,
            tokens_seen=TokensSeen(data, config.shape.seq_len, config.train_batch_size, config.seed),
        ),
        wandb_config(config.wandb_project, config.output_path, config.initialize_from),
    )
    trainer = TrainerConfig(
        seed=config.seed,
        mp=precision_policy(config.compute_dtype),
        mesh=trainer_mesh(config.mesh, config.shape, jax.device_count()),
        id=run_id,
        tracker=trackers,
        log_dir=Path(local_dir(config.output_path, "logs")),
        watch=_watch(config),
        train_batch_size=config.train_batch_size,
        per_device_parallelism=config.per_device_parallelism,
        per_device_eval_parallelism=config.per_device_parallelism if config.eval_batch_size is None
        else config.eval_batch_size // jax.device_count(),
        num_train_steps=config.num_train_steps,
        steps_per_eval=config.steps_per_eval,
        max_eval_batches=config.max_eval_batches,
        checkpointer=CheckpointerConfig(
            base_path=storage.join(config.output_path, "checkpoints"),
            append_run_id_to_base_path=False,
            save_interval=timedelta(seconds=config.temporary_checkpoint_seconds),
            keep=[{"every": config.checkpoint_every_steps}],
        ),
        initialize_from=config.initialize_from,
        # A gang member (executor/run/gang.py) has joined its peers already; Levanter would try again on a TPU VM.
        distributed=DistributedConfig(initialize_jax_distributed=not jax.distributed.is_initialized()),
        require_accelerator=False,
        log_jaxprs=False,
        log_xla_hlo=False,
    )
    return train_lm.TrainLmConfig(
        data=data,
        trainer=trainer,
        model=model_config(config),
        optimizer=train_optimizer(config),
        z_loss_weight=config.z_loss_weight,
    )


def train_optimizer(config: TrainConfig) -> OptimizerConfig:
    """The run's optimizer as Levanter's config (steps/train/optimizer.py)."""
    return levanter_optimizer(config.optimizer, learning_rate=config.learning_rate, weight_decay=config.weight_decay,
                              warmup=config.warmup, min_lr_ratio=config.min_lr_ratio, lr_schedule=config.lr_schedule,
                              hero=config.hero_hyperparameters)  # fmt: skip

def model_config(config: TrainConfig) -> MoeConfig:
    """The model Levanter builds for the run."""
    return qwen3_moe_config(
        config.shape,
        tokenizer_path=config.tokenizer_path,
        router_aux_loss_coef=config.router_aux_loss_coef,
        router_bias_balancing=config.router_bias_balancing,
        router_z_loss_weight=config.router_z_loss_weight,
        capacity_factor=config.capacity_factor,
        router_combine=config.router_combine,
        router_combine_sum=config.router_combine_sum,
        remat=config.remat,
        step=_step_label(config),
    )


def record_optimizer_groups(config: TrainConfig) -> None:
    """Write `optimizer_groups.json`: which optimizer group each parameter is in (steps/train/optimizer.py)."""
    model = model_config(config)
    vocab = Axis("vocab", config.shape.vocab_size)
    write_optimizer_groups(config.output_path, config.optimizer, lambda: model.build(vocab, key=jax.random.PRNGKey(0)))


# --- the process around one training run (module docstring) ---


def close_log_files(log_dir: str | os.PathLike[str]) -> None:
    """Detach and close the root logger's file handlers writing under `log_dir`.

    Levanter's trainer adds a file handler for its run's log file to the root logger and never removes it: in a
    process that runs several steps (a Ray worker), every later step's log lines would also land in this step's
    `logs/` folder."""
    folder = os.path.abspath(log_dir)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and os.path.dirname(handler.baseFilename) == folder:
            root.removeHandler(handler)
            handler.close()


def local_dir(output_path: str, name: str) -> str:
    """A local folder for tools that write only local files (wandb, Levanter's log files): under the output
    path when it is local, else a temporary folder that `keep_local_folder` uploads at the end of the run."""
    if not storage.on_local_disk(output_path):
        return tempfile.mkdtemp(prefix=f"{name}-")
    folder = os.path.join(storage.make_absolute(output_path).removeprefix("file://").removeprefix("local://"), name)
    os.makedirs(folder, exist_ok=True)
    return folder


def keep_local_folder(local: str, output_path: str, name: str) -> None:
    """With an object-store output, upload a `local_dir` folder's files to `<output>/<name>/` and delete it
    (a killed run leaves it in the temp folder). A failed upload is logged, not raised: it must not hide
    the run's own outcome, and the files stay where the warning says."""
    if storage.on_local_disk(output_path) or not os.path.isdir(local):
        return
    try:
        for folder, _subfolders, names in os.walk(local):
            for file_name in names:
                path = os.path.join(folder, file_name)
                if not os.path.islink(path):
                    relative = os.path.relpath(path, local).replace(os.sep, "/")
                    storage.upload_file(path, storage.join(output_path, name, relative))
    except Exception as error:  # any storage failure: the run's own result stands
        logger.warning("%s: could not upload %s to %s/%s (%r); the files stay there", output_path, local,
                       output_path, name, error)  # fmt: skip
        return
    shutil.rmtree(local, ignore_errors=True)


_ONE_RUN_PER_PROCESS = threading.Lock()


@contextlib.contextmanager
def training_environment(output_path: str) -> Iterator[None]:
    """The process environment Levanter and wandb read, for one run: offline hub and wandb (unless the caller
    set WANDB_MODE), wandb files under the output path, and a throwaway MARIN_PREFIX. Restored after.

    All of it is process-wide (environment variables, wandb's setup, Levanter's global tracker, which writes
    metrics.jsonl), so one run holds it at a time: a second train step in the same process (the local backend
    runs steps in threads) waits for the first instead of logging into its files."""
    if not _ONE_RUN_PER_PROCESS.acquire(blocking=False):
        logger.info("%s: waiting for another training run in this process to finish", output_path)
        _ONE_RUN_PER_PROCESS.acquire()
    try:
        with _environment(output_path):
            yield
    finally:
        _ONE_RUN_PER_PROCESS.release()


@contextlib.contextmanager
def _environment(output_path: str) -> Iterator[None]:
    settings = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
        "WANDB_DIR": local_dir(output_path, "wandb"),
        "WANDB_SILENT": "true",
    }
    previous = {name: os.environ.get(name) for name in [*settings, "MARIN_PREFIX"]}
    with tempfile.TemporaryDirectory(prefix="marin-prefix-") as marin_prefix:
        os.environ.update(settings, MARIN_PREFIX=marin_prefix)
        # wandb keeps one process-wide setup, made from the environment of its first run: a second train step
        # in the same worker process (a Ray worker runs many) would write into the first step's WANDB_DIR.
        wandb.teardown()
        try:
            yield
        finally:
            # Stop the wandb service this run started and drop its WANDB_SERVICE token from the environment:
            # left there, every process started later from this one (an executor subprocess, a rerun after a
            # kill) would join this service, which still holds a killed run's id ("run ID is in use").
            wandb.teardown()
            # Levanter's tracker registers an atexit hook that tears wandb down again from a new thread, which
            # fails at interpreter exit ("can't create new thread at interpreter shutdown"): done here already.
            atexit.unregister(getattr(levanter_wandb, "_teardown_wandb_service_bounded", lambda *_: None))
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            keep_local_folder(settings["WANDB_DIR"], output_path, "wandb")


TRAINING = "training"
"""The progress phase of the whole run (`executor.progress`): from its start the gang's watch expects steps, the
first within `ResourceConfig.first_step_timeout_s`; each completed step is reported by the trackers
(steps/train/train_metrics.py)."""


EVAL = progress.EVAL
"""The progress phase of a periodic or final eval, inside `TRAINING`: no step completes while it runs, and the
first one compiles the eval's program besides. A gang's watch grants it `ResourceConfig.eval_timeout_s` from its
start (as it grants "checkpoint" `checkpoint_timeout_s`), which the plan sizes from the eval
(experiments/train_defaults.py `Rung.train_resources`), so a slow eval is never called a stall while a stall in
training is still caught after the hang timeout."""


def in_eval_phase[T](evaluate: Callable[[T], None]) -> Callable[[T], None]:
    """`evaluate` (an eval hook of Levanter's trainer, called with the step's info) run in progress phase `EVAL`."""

    @functools.wraps(evaluate)
    def evaluate_in_phase(step: T) -> None:
        with progress.phase(EVAL):
            evaluate(step)

    return evaluate_in_phase


@contextlib.contextmanager
def checkpoint_saves_in_their_phase() -> Iterator[None]:
    """Each checkpoint save runs in progress phase "checkpoint", which a gang's watch allows
    `ResourceConfig.checkpoint_timeout_s` without a completed step. Levanter's trainer saves through
    `Checkpointer.save_checkpoint`, which is wrapped for the length of the run."""
    save = Checkpointer.save_checkpoint

    @functools.wraps(save)
    def save_in_phase(self: Checkpointer, *args: Any, **kwargs: Any) -> Any:
        with progress.phase(progress.CHECKPOINT):
            return save(self, *args, **kwargs)

    Checkpointer.save_checkpoint = save_in_phase
    try:
        yield
    finally:
        Checkpointer.save_checkpoint = save
