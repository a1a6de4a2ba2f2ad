"""The suite's tiers: markers given from what a test uses, and the quick tier `make test-quick` runs.

A test is marked by hand where only its body knows (`ray`, `training`, `slow`), and here, at collection, where what
it asks for says it, so that a new test lands in its tier without a hand-written mark:

- a fixture that starts a service or a program marks every test using it (`FIXTURE_MARKERS`): the GCS emulator
  (`gcs`), moto's S3 server (`s3`), Chromium (`browser`), the tiny hero's run (`demo`, `training`, `ray`, `slow`),
  and by the suite's convention a module's `local_ray` (`ray`) and a module's `trained` model or run (`training`);
- a folder marks every test in it (`FOLDER_MARKERS`): tests/e2e/ is `e2e`.

`--quick` (`make test-quick`) runs the unit tests of executor/ and steps/ for the edit loop: tests/executor/ and
tests/steps/ less every test marked with one of `QUICK_EXCLUDES` (Ray, training and compile subprocesses, browsers,
services, the demo, whatever is marked slow). `make test` runs every tier. In the quick tier a test that starts Ray
without its `ray` mark fails, saying so, and Ray is shut down for the next one: the tier stays quick by construction,
not by everyone remembering.
"""

from __future__ import annotations

import sys
from collections.abc import Generator

import pytest

FIXTURE_MARKERS: dict[str, tuple[str, ...]] = {
    "gcs_emulator": ("gcs",),
    "s3_server": ("s3",),
    "browser": ("browser",),
    "page": ("browser",),
    "hero_run": ("demo", "training", "ray", "slow"),
    "local_ray": ("ray",),
    "trained": ("training",),
}
"""Fixtures that start something slow or outside this process, and the markers every test using them gets."""

FOLDER_MARKERS: dict[str, tuple[str, ...]] = {"tests/e2e/": ("e2e",)}
"""Folders (from the repository root) whose every test gets these markers."""

QUICK_FOLDERS = ("tests/executor/", "tests/steps/")
"""Where the quick tier's tests live: the unit tests of the library and of the steps."""

QUICK_EXCLUDES = ("slow", "ray", "training", "browser", "gcs", "s3", "demo", "e2e")
"""A test with any of these markers is left to `make test`."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        default=False,
        help="only the quick tier: tests/executor/ and tests/steps/ without " + ", ".join(QUICK_EXCLUDES),
    )


def markers_from_use(item: pytest.Item) -> set[str]:
    """The markers a test gets from the fixtures it uses and the folder it is in."""
    names = {marker for fixture in getattr(item, "fixturenames", ()) for marker in FIXTURE_MARKERS.get(fixture, ())}
    path = item.nodeid.split("::")[0]
    names |= {marker for folder, markers in FOLDER_MARKERS.items() if path.startswith(folder) for marker in markers}
    return names


def in_quick_tier(item: pytest.Item) -> bool:
    return item.nodeid.startswith(QUICK_FOLDERS) and not any(item.get_closest_marker(name) for name in QUICK_EXCLUDES)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in sorted(markers_from_use(item)):
            if not item.get_closest_marker(name):
                item.add_marker(name)
    if not config.getoption("quick"):
        return
    kept = [item for item in items if in_quick_tier(item)]
    left = [item for item in items if not in_quick_tier(item)]
    if left:
        config.hook.pytest_deselected(items=left)
    items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """In the quick tier, fail a test that left Ray running: it needs its `ray` mark."""
    result = yield
    ray = sys.modules.get("ray")
    if item.config.getoption("quick") and ray is not None and ray.is_initialized():
        ray.shutdown()
        raise pytest.fail.Exception(
            f"{item.nodeid} started Ray: mark it @pytest.mark.ray so that `make test-quick` leaves it to `make test`"
        )
    return result
