"""README.md's code runs as written.

Every ```python block must at least compile. A block preceded by `<!-- readme-test: run -->` is run,
in README order, in one temporary folder: a python block marked `file=NAME` is saved there as NAME; a bash
block runs line by line (`python` is this interpreter, the repository is on PYTHONPATH), each command must
exit 0, and a double-quoted phrase in its comment ("4 step(s) ran here, 0 were already done") must appear in
its output. So the worked example, the commands after it and what the README says they print are tested.
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

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
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


def test_every_python_block_compiles():
    text = README.read_text()
    for match in FENCE.finditer(text):
        if match["lang"] == "python":
            line = text[: match.start()].count("\n") + 1
            compile(match["body"], f"README.md:{line}", "exec")


@pytest.mark.slow
def test_marked_blocks_run_as_written(tmp_path):
    blocks = runnable_blocks(README.read_text())
    assert any(block.file for block in blocks) and any(block.lang == "bash" for block in blocks)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "EXECUTOR_PREFIX": str(tmp_path / "outputs")}
    for block in blocks:
        if block.file is not None:
            (tmp_path / block.file).write_text(block.body)
            continue
        assert block.lang == "bash", f"README.md:{block.line}: only python files and bash commands run"
        for argv, phrases in commands_of(block):
            if argv[0] == "python":
                argv = [sys.executable, *argv[1:]]
            result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            output = result.stdout + result.stderr
            where = f"README.md:{block.line}: {shlex.join(argv)}"
            assert result.returncode == 0, f"{where} exited {result.returncode}:\n{output[-3000:]}"
            for phrase in phrases:
                assert phrase in " ".join(output.split()), f"{where}: {phrase!r} not in its output:\n{output[-3000:]}"
