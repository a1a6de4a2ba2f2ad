"""mkdocs hook: the site's home page is the repository's README.md, and its changelog CHANGELOG.md.

Both are written for readers of the repository, so their links into the site start with `docs/`
(`docs/concepts.md#step-identity`, `docs/img/run-view.png`); here they are the site's own pages. Generating the
two pages at build time keeps one copy of each text.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
PAGES = {"index.md": "README.md", "changelog.md": "CHANGELOG.md"}
# A link from the repository's top folder, as the site spells it.
LINK = re.compile(r"\]\((?:docs/|(?P<top>README\.md|CHANGELOG\.md))")
SITE_NAME = {source: page for page, source in PAGES.items()}


def site_links(text: str) -> str:
    return LINK.sub(lambda match: "](" + (SITE_NAME[match["top"]] if match["top"] else ""), text)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for page, source in PAGES.items():
        files.append(File.generated(config, page, content=site_links((REPO / source).read_text())))
    return files
