"""CHANGELOG.md is by release: `[Unreleased]` on top, then one dated section per 0.x version, newest first, the
newest being the version pyproject.toml holds."""

from __future__ import annotations

import datetime
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})")


def sections() -> list[str]:
    return [line for line in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines() if line.startswith("## ")]


def test_the_changelog_is_by_release_newest_first_under_unreleased() -> None:
    headings = sections()
    assert headings[0] == "## [Unreleased]"
    releases = [RELEASE.fullmatch(heading) for heading in headings[1:]]
    assert all(releases), [heading for heading, match in zip(headings[1:], releases, strict=True) if not match]
    versions = [tuple(int(part) for part in match["version"].split(".")) for match in releases if match]
    dates = [datetime.date.fromisoformat(match["date"]) for match in releases if match]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert dates == sorted(dates, reverse=True)
    assert all(version[0] == 0 for version in versions), "the project is 0.x until its API is declared stable"


def test_pyproject_holds_the_newest_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    newest = RELEASE.fullmatch(sections()[1])
    assert newest is not None and project["version"] == newest["version"]
