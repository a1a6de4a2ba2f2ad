"""The docs site builds with `mkdocs build --strict`, offline, as `make docs` builds it.

Strict mode turns every warning into a failure, and mkdocs.yml's `validation` makes a link to a missing page,
an anchor no page has, and a page in docs/ that the nav leaves out warnings. The home page and the changelog
are README.md and CHANGELOG.md (docs/hooks/readme_home.py), so their links are checked too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from paths import REPO


def nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_the_site_builds_strictly_with_no_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "WARNING" not in output, output[-3000:]
    # The home page is the README, picture included, and the changelog is a page of its own.
    assert "A worked example" in (site / "index.html").read_text()
    assert (site / "img" / "run-view.png").is_file() and (site / "changelog" / "index.html").is_file()


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = {path.relative_to(REPO / "docs").as_posix() for path in (REPO / "docs").glob("*.md")}
    listed = set(nav_pages(config["nav"]))
    assert pages | {"index.md", "changelog.md"} == listed, sorted(listed ^ (pages | {"index.md", "changelog.md"}))
