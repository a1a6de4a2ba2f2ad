"""`executor_main`: the command line every experiment file ends with.

python experiments/demo.py                       # run what is not done yet
python experiments/demo.py --dry_run true        # say what would run, write nothing
python experiments/demo.py --run_only '["tokenizer"]' --force_run '["tokenizer"]'
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import draccus

from executor.executor import Executor
from executor.step_spec import ExecutorStep, InputName

logger = logging.getLogger(__name__)

PREFIX_ENV = "EXECUTOR_PREFIX"


@dataclass
class ExecutorMainConfig:
    prefix: str | None = None
    """Where outputs go (local folder, gs://, s3://, memory://). Default: $EXECUTOR_PREFIX, else ./outputs."""
    executor_info_base_path: str | None = None
    """Where the experiment JSON goes. Default: <prefix>/experiments."""
    dry_run: bool = False
    """Print what would run, skip or wait, and why; write nothing."""
    run_only: list[str] | None = None
    """Regexes (searched in step names): run only the matching steps and their dependencies."""
    force_run: list[str] | None = None
    """Regexes: rerun the matching steps even if they succeeded."""
    force_run_failed: bool = True
    """Rerun steps that failed before (false: stop and say so)."""
    max_concurrent: int | None = None
    """Steps running at once (at least 1). Default: max(4, CPUs) locally; on Ray, as many as the cluster takes."""
    backend: str = "local"
    """Where steps run: local (threads in this process) or ray (RAY_ADDRESS, else a local Ray)."""
    shared_filesystem: bool = False
    """The local-disk prefix is mounted on every node of the Ray cluster at RAY_ADDRESS (NFS, a shared
    volume); without it such a run needs an object-store prefix."""


def configure_logging(level: int = logging.INFO) -> None:
    """Configure logging once, for command-line entry points; libraries never call this."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    else:
        root.setLevel(level)


def resolve_prefix(prefix: str | None) -> str:
    return prefix or os.environ.get(PREFIX_ENV) or "outputs"


def executor_main(
    steps: Sequence[ExecutorStep | InputName], description: str | None = None, args: Sequence[str] | None = None
) -> Executor:
    """Parse the command line into an `ExecutorMainConfig` and run `steps` (an `InputName` stands for its step)."""
    config = draccus.parse(ExecutorMainConfig, args=sys.argv[1:] if args is None else list(args))
    configure_logging()
    frame = inspect.currentframe()
    caller = frame.f_back.f_code.co_filename if frame is not None and frame.f_back is not None else "experiment"
    executor = Executor(
        prefix=resolve_prefix(config.prefix),
        executor_info_base_path=config.executor_info_base_path,
        backend=config.backend,
        shared_filesystem=config.shared_filesystem,
    )
    executor.run(
        steps,
        dry_run=config.dry_run,
        run_only=config.run_only,
        force_run=config.force_run,
        force_run_failed=config.force_run_failed,
        max_concurrent=config.max_concurrent,
        caller=caller,
        description=description,
    )
    if not config.dry_run:
        logger.info("experiment: %s", executor.executor_info_path)
    return executor
