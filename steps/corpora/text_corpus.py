"""Build a small real text corpus, offline, from the Python standard library on this machine.

Two sources, so that a demo DAG has two corpora of different character:

- `python_stdlib`: the `.py` files of the running interpreter's stdlib (no `site-packages`, no
  test suites), one document per file: code.
- `python_docstrings`: per module whose docstring is non-trivial, that docstring followed by the
  docstrings of its classes and functions: English prose about code.

Files are taken in sorted path order and the first `max_docs` documents are kept, so the corpus
is a deterministic function of the config and the interpreter. The stdlib's text differs between
Python versions, which the executor cannot see; experiments therefore version `python_version`
and the step refuses to run under another interpreter rather than write an output that does not
match its hash.

Output: `shard-00000.jsonl.gz`, ... (records `{"id", "text", "source"}`) and `stats.json`.
"""

from __future__ import annotations

import ast
import logging
import os
import platform
import sysconfig
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from executor import storage
from steps.data.jsonl_shards import write_shards

logger = logging.getLogger(__name__)

SOURCES = ("python_stdlib", "python_docstrings")
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__"})
"""Directory names never read: third-party packages and the stdlib's own test suites."""


@dataclass(frozen=True)
class TextCorpusConfig:
    source: str
    """Which text to read: "python_stdlib" (source files) or "python_docstrings" (prose). Versioned."""
    output_path: str
    """Where the shards and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    max_docs: int = 400
    """Keep the first this many documents (in sorted path order). Versioned: it changes the corpus."""
    docs_per_shard: int = 100
    """Documents per shard file. Only the file layout depends on it, so it is left unversioned."""
    min_docstring_chars: int = 200
    """python_docstrings only: skip modules whose own docstring is shorter (one-liners are not prose)."""
    python_version: str | None = None
    """The interpreter version (`platform.python_version()`) whose stdlib is read, or None to accept
    any. Experiments version it, since the stdlib's text, and so the corpus, depends on it."""


def build_text_corpus(config: TextCorpusConfig) -> None:
    _check(config)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    records = []
    for doc_id, text in _documents(config, stdlib):
        records.append({"id": doc_id, "text": text, "source": config.source})
        if len(records) == config.max_docs:
            break
    shards = write_shards(config.output_path, records, config.docs_per_shard)
    stats = {
        "source": config.source,
        "docs": len(records),
        "bytes": sum(len(record["text"].encode("utf-8")) for record in records),
        "shards": shards,
        "python_version": platform.python_version(),
        "stdlib": str(stdlib),
    }
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), stats)
    logger.info("%s: %d docs, %d bytes in %d shard(s)", config.source, stats["docs"], stats["bytes"], shards)


def _check(config: TextCorpusConfig) -> None:
    if config.source not in SOURCES:
        raise ValueError(f"unknown source {config.source!r}; choose one of {', '.join(SOURCES)}")
    if config.max_docs < 1:
        raise ValueError(f"max_docs must be at least 1, got {config.max_docs}")
    if config.docs_per_shard < 1:
        raise ValueError(f"docs_per_shard must be at least 1, got {config.docs_per_shard}")
    running = platform.python_version()
    if config.python_version is not None and config.python_version != running:
        raise ValueError(
            f"this corpus is versioned for Python {config.python_version}'s stdlib but the step runs under "
            f"Python {running}, whose files differ; run it under {config.python_version} or rebuild the DAG "
            "here so that python_version (and so the output path) matches"
        )


def _documents(config: TextCorpusConfig, stdlib: Path) -> Iterator[tuple[str, str]]:
    """(id, text) pairs in sorted path order; files that cannot be read or parsed are skipped."""
    for relative in stdlib_files(stdlib):
        text = _read_source(stdlib / relative)
        if text is None:
            continue
        if config.source == "python_docstrings":
            text = module_prose(text, config.min_docstring_chars)
            if text is None:
                continue
        yield f"{config.source}/{relative}", text


def stdlib_files(stdlib: Path) -> list[str]:
    """Relative POSIX paths of the stdlib's `.py` files, sorted, without excluded directories."""
    found: list[str] = []
    for directory, subdirectories, files in os.walk(stdlib):
        subdirectories[:] = [name for name in subdirectories if name not in EXCLUDED_DIRS]
        found.extend(Path(directory, name).relative_to(stdlib).as_posix() for name in files if name.endswith(".py"))
    return sorted(found)


def _read_source(path: Path) -> str | None:
    """The file's text, decoded as Python does (PEP 263 coding cookie), or None if that fails."""
    try:
        with tokenize.open(path) as handle:
            return handle.read()
    except (SyntaxError, UnicodeDecodeError, OSError) as error:
        logger.warning("skipping %s: %s", path, error)
        return None


def module_prose(source_text: str, min_docstring_chars: int) -> str | None:
    """The module docstring then its classes' and functions' docstrings, in source order.

    None if the module has no docstring of at least `min_docstring_chars` or does not parse.
    """
    try:
        tree = ast.parse(source_text)
    except SyntaxError:
        return None
    module_doc = ast.get_docstring(tree)
    if module_doc is None or len(module_doc) < min_docstring_chars:
        return None
    definitions = sorted(
        (node for node in ast.walk(tree) if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))),
        key=lambda node: (node.lineno, node.col_offset),
    )
    parts = [module_doc]
    parts.extend(doc for node in definitions if (doc := ast.get_docstring(node)))
    return "\n\n".join(parts) + "\n"
