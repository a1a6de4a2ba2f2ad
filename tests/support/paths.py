"""Where things are, for tests in any folder of tests/ and the helpers they run as subprocesses."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
"""tests/support/: fixtures, step functions and the scripts tests run as subprocesses."""
TESTS = SUPPORT.parent
DATA = TESTS / "data"
"""Small committed inputs: pinned step hashes, the tiny demo's metrics, memory plans."""
REPO = TESTS.parent


def with_wandb_as_shipped(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` without the suite's WANDB_MODE=disabled (tests/conftest.py): a run started with it writes
    wandb's offline files as a user's run does (steps/train/train.py `training_environment`)."""
    return {name: value for name, value in environment.items() if name != "WANDB_MODE"}
