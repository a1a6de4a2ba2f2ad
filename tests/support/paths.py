"""Where things are, for tests in any folder of tests/ and the helpers they run as subprocesses."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
"""tests/support/: fixtures, step functions and the scripts tests run as subprocesses."""
TESTS = SUPPORT.parent
DATA = TESTS / "data"
"""Small committed inputs: pinned step hashes, the tiny demo's metrics, memory plans."""
REPO = TESTS.parent
