"""The process around one training run: the environment Levanter and wandb read, and files that only exist locally.

Levanter and wandb are configured through process-wide state: environment variables (offline hub, wandb's mode
and folder, MARIN_PREFIX), wandb's one setup per process, the root logger's file handlers. The train step
(steps/train/train.py) wraps each run in `training_environment`, which sets that state for the run alone and
restores it after, so that several train steps in one worker process (Ray runs many) never write into one
another's files. Tools that write only local files get a folder of the output path when it is local, or a
temporary one that is uploaded to `<output>/<name>/` when the output is on an object store (`local_dir`,
`keep_local_folder`). A run also tells a gang's watch how far it got (executor/run/gang_progress.py): it runs in phase
`TRAINING`, each checkpoint save in phase "checkpoint" (`checkpoint_saves_in_their_phase`) and each eval in phase
`EVAL` (`in_eval_phase`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import wandb
from levanter.checkpoint import Checkpointer
from levanter.tracker import wandb as levanter_wandb

from executor import progress, storage

logger = logging.getLogger(__name__)


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
