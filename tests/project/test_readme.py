"""README.md's and the docs pages' code runs as written.

Every ```python block of README.md and docs/*.md must at least compile. A block preceded by
`<!-- readme-test: run -->` is run: a python block marked `file=NAME` is saved as NAME; a bash block runs line
by line (`python` is this interpreter, the repository is on PYTHONPATH), each command must exit 0, and a
double-quoted phrase in its comment ("4 step(s) ran here, 0 were already done") must appear in its output.
README's blocks run first, in order, in one temporary folder; then each docs page's, in page order, in that
same folder, so a page can read what the worked example left in `outputs/` (pages must not depend on each
other: each page is a test of its own). So the worked example, the commands after it and what the docs say
they print are tested.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from paths import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- readme-test: run(?: file=(?P<file>\S+))? -->\n```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
FENCE = re.compile(r"```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    file: str | None
    line: int


def runnable_blocks(text: str) -> list[Block]:
    return [
        Block(match["lang"], match["body"], match["file"], text[: match.start()].count("\n") + 1)
        for match in MARKER.finditer(text)
    ]


def commands_of(block: Block) -> list[tuple[list[str], list[str]]]:
    """(argv, phrases its comment promises in the output) for each command line of a bash block."""
    commands = []
    for line in block.body.splitlines():
        code, _, comment = line.partition(" # ")
        if code.strip():
            commands.append((shlex.split(code), re.findall(r'"([^"]+)"', comment)))
    return commands


def name_of(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def run_blocks(page: Path, folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "EXECUTOR_PREFIX": str(folder / "outputs")}
    for block in runnable_blocks(page.read_text()):
        where = f"{name_of(page)}:{block.line}"
        if block.file is not None:
            (folder / block.file).write_text(block.body)
            continue
        assert block.lang == "bash", f"{where}: only python files and bash commands run"
        for argv, phrases in commands_of(block):
            if argv[0] == "python":
                argv = [sys.executable, *argv[1:]]
            result = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
            output = result.stdout + result.stderr
            command = f"{where}: {shlex.join(argv)}"
            assert result.returncode == 0, f"{command} exited {result.returncode}:\n{output[-3000:]}"
            for phrase in phrases:
                assert phrase in " ".join(output.split()), f"{command}: {phrase!r} not in its output:\n{output[-3000:]}"


@pytest.mark.parametrize("page", PAGES, ids=name_of)
def test_every_python_block_compiles(page: Path) -> None:
    text = page.read_text()
    for match in FENCE.finditer(text):
        if match["lang"] == "python":
            line = text[: match.start()].count("\n") + 1
            compile(match["body"], f"{name_of(page)}:{line}", "exec")


@pytest.fixture(scope="module")
def worked_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder README's blocks ran in: the worked example's `mine.py` and its `outputs/`."""
    folder = tmp_path_factory.mktemp("readme")
    run_blocks(README, folder)
    return folder


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readmes_marked_blocks_run_as_written(worked_example: Path) -> None:
    blocks = runnable_blocks(README.read_text())
    assert any(block.file for block in blocks) and any(block.lang == "bash" for block in blocks)
    assert (worked_example / "outputs" / "experiments").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", [page for page in PAGES[1:] if runnable_blocks(page.read_text())], ids=name_of)
def test_a_docs_pages_marked_blocks_run_as_written(page: Path, worked_example: Path) -> None:
    run_blocks(page, worked_example)
