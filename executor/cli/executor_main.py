"""`executor_main`: the command line every experiment file ends with.

python experiments/demo.py                       # run what is not done yet
python experiments/demo.py --dry_run true        # say what would run, write nothing
python experiments/demo.py --force_run stats      # rerun one step (a regex matching whole step names)
python experiments/demo.py --force_run 'train/.*' --yes   # rerun every train step, discarding their checkpoints
python experiments/demo.py --run_only 'corpus,tokenizer' --force_run '["^stats$"]'
python experiments/demo.py --pins experiments/demo.pins.json   # fail loudly where the bytes are not the pinned ones

`--run_only` and `--force_run` take one pattern, comma-separated patterns, or a list (`'[a, b]'`,
JSON or YAML flow style; use it for a regex that holds a comma). Mistakes the user can fix (a bad
flag value, a pattern matching no step, a failed step) end the command with their message and the
user's own frames, not the executor's (see error_report.py).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import draccus
import yaml

from executor.cli.error_report import install_excepthook
from executor.dag.spec import ExecutorStep, InputName
from executor.errors import ConfigError
from executor.run.executor import Executor

logger = logging.getLogger(__name__)

PREFIX_ENV = "EXECUTOR_PREFIX"


@dataclass
class ExecutorMainConfig:
    """The flags of every experiment file, e.g. `python mine.py --dry_run true --show_all true`,
    `python mine.py --force_run mine/stats`, `python mine.py --run_only 'corpus,stats' --max_concurrent 2`."""

    prefix: str | None = None
    """Where outputs go (local folder, gs://, s3://, memory://). Default: $EXECUTOR_PREFIX, else ./outputs."""
    executor_info_base_path: str | None = None
    """Where the experiment JSON goes. Default: <prefix>/experiments."""
    dry_run: bool = False
    """Print what would run, skip, wait or be taken over, and why; write nothing."""
    show_all: bool = False
    """With dry_run: also list the steps of the DAG this run would not look at (finished and not needed)."""
    run_only: list[str] | None = None
    """Regexes matching whole step names (executor/dag/patterns.py; a glob is refused with the regex it meant): run
    only the matching steps and their dependencies. On the command line: `--run_only NAME`, `--run_only 'a,b'`
    or `--run_only '[a, b]'`."""
    force_run: list[str] | None = None
    """Regexes matching whole step names: rerun the matching steps even if they succeeded, from an empty output
    folder (checkpoints included: see `yes`). Same forms as `run_only`."""
    force_run_failed: bool = True
    """Rerun steps that failed before (false: stop and say so)."""
    max_concurrent: int | None = None
    """Steps running at once (at least 1). Default: max(4, CPUs) locally; on Ray, as many as the cluster takes."""
    backend: str = "local"
    """Where steps run: local (threads in this process) or ray (RAY_ADDRESS, else a local Ray)."""
    pins: str | None = None
    """A pin file (`python -m executor pin`): steps pinned under another hash stop the run before anything runs;
    a pinned step whose bytes are not the pinned ones is FAILED, its output kept."""
    shared_filesystem: bool = False
    """The local-disk prefix is mounted on every node of the Ray cluster at RAY_ADDRESS (NFS, a shared
    volume); without it such a run needs an object-store prefix."""
    yes: bool = False
    """Let `--force_run` discard forced steps' checkpoints (a train step's run) without asking; without it the
    run asks at a terminal and stops elsewhere, listing them (executor/run/force_guard.py). `--yes` alone works."""


def configure_logging(level: int = logging.INFO) -> None:
    """Configure logging once, for command-line entry points; libraries never call this."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    else:
        root.setLevel(level)


def resolve_prefix(prefix: str | None) -> str:
    return prefix or os.environ.get(PREFIX_ENV) or "outputs"


PATTERN_FLAGS = ("--run_only", "--force_run")
PATTERN_FORMS = "NAME, 'a,b' (comma-separated) or '[a, b]' (a list; use it for a regex holding a comma)"


def _as_pattern_list(flag: str, value: str) -> str:
    """A single pattern or comma-separated patterns as the list draccus expects; a list is checked."""
    if not value.lstrip().startswith("["):
        return json.dumps([pattern.strip() for pattern in value.split(",") if pattern.strip()])
    try:
        patterns = yaml.safe_load(value)  # how draccus reads a list
    except yaml.YAMLError as error:
        raise ConfigError(
            f"{flag} {value!r} is not a list ({' '.join(str(error).split())}); {flag} takes {PATTERN_FORMS}"
        ) from error
    if not isinstance(patterns, list) or not all(isinstance(pattern, str) for pattern in patterns):
        raise ConfigError(f"{flag} {value!r} is not a list of patterns; {flag} takes {PATTERN_FORMS}")
    return value


def normalize_pattern_flags(argv: Sequence[str]) -> list[str]:
    """`--force_run stats` and `--force_run=a,b` become the list form, a bare `--yes` is `--yes=true`; everything
    else is kept."""
    normalized: list[str] = []
    pending_flag: str | None = None
    for position, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if arg == "--yes" and pending_flag is None and argv[position + 1 : position + 2] not in (["true"], ["false"]):
            normalized.append("--yes=true")
        elif pending_flag is not None:
            normalized.append(_as_pattern_list(pending_flag, arg))
        elif equals and flag in PATTERN_FLAGS:
            normalized.append(f"{flag}={_as_pattern_list(flag, value)}")
        else:
            normalized.append(arg)
        pending_flag = arg if not equals and arg in PATTERN_FLAGS else None
    return normalized


def parse_command_line(argv: Sequence[str]) -> ExecutorMainConfig:
    """`ExecutorMainConfig` from the command line; a value that cannot be read is one `ConfigError` line."""
    normalized = normalize_pattern_flags(argv)
    try:
        return draccus.parse(ExecutorMainConfig, args=normalized)
    except draccus.utils.ParsingError as error:
        raise ConfigError(f"bad command line ({' '.join(str(error).split())}); see --help") from error


def _confirmer(yes: bool) -> Callable[[str], bool]:
    """`--yes` confirms; else a terminal is asked; else (a script, CI) the answer is no."""

    def confirm(question: str) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            return False
        return input(f"{question}\nDiscard them? Type yes to go on: ").strip().lower() == "yes"

    return confirm


def executor_main(
    steps: Sequence[ExecutorStep | InputName], description: str | None = None, args: Sequence[str] | None = None
) -> Executor:
    """Parse the command line into an `ExecutorMainConfig` and run `steps` (an `InputName` stands for its step).

    `description` is stored in the experiment file and shown on the dashboard's experiment list."""
    install_excepthook()
    config = parse_command_line(sys.argv[1:] if args is None else args)
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
        show_all=config.show_all,
        run_only=config.run_only,
        force_run=config.force_run,
        force_run_failed=config.force_run_failed,
        max_concurrent=config.max_concurrent,
        caller=caller,
        description=description,
        confirm_discard=_confirmer(config.yes),
        pins=config.pins,
    )
    if not config.dry_run:
        logger.info("%s; experiment: %s", executor.summary(), executor.executor_info_path)
    return executor
