"""The tiny run's held-out eval suite, as text: Paloma-style subsets from offline text the training corpus never reads.

Paloma (the hero's metric) is 16 held-out subsets, each scored on its own and averaged without weights. Offline,
the tiny run stands in with subsets of a different character each, none of them a source of the training corpus
(steps/corpora/real_corpus.py reads docstrings, the stdlib's code, pydoc topics and the KJV):

- `man_commands`, `man_syscalls`, `man_library`, `man_formats`, `man_overviews`, `man_admin`: manual pages of
  sections 1, 2, 3, 4-5, 7 and 8 (Debian's `manpages` and `manpages-dev`, and every installed package's section 1
  and 8 pages), their roff markup stripped to prose;
- `debian_changelogs`: Debian packages' `changelog.Debian.gz` entries;
- `package_readmes`: the long descriptions (READMEs) in installed Python packages' `METADATA`;
- `debian_readmes`: Debian packages' README files (`/usr/share/doc/<package>/README*`).

Each source file is cut into passages of at most `passage_words` words at paragraph breaks. Files are visited in
the order of a hash of their name (with its folder), and at most `passages_per_file` passages are taken from each,
until the subset holds `bytes_per_subset` bytes: a sample spread over many files, independent of directory order,
and small next to the training data, since decontamination drops every training document that shares a 13-gram
with it. What is installed differs between machines (the step's hash cannot see it), so `stats.json` lists every
passage's id.

The token cap is applied later, with the run's tokenizer (steps/tokenize/eval_suite.py); this text is also the
eval set that decontamination removes from the training data, so it must exist before the tokenizer does.

Output: `subsets/<subset>/passages.jsonl` (records `{"id", "text", "source"}`) and `stats.json`.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from executor import storage
from executor.errors import ConfigError

logger = logging.getLogger(__name__)

MAN = Path("/usr/share/man")
DOC = Path("/usr/share/doc")


class EvalSuiteSourceError(ConfigError):
    """An eval suite subset found no text on this machine."""


def _files(*patterns: tuple[Path, str]) -> list[Path]:
    return sorted(path for root, pattern in patterns for path in root.glob(pattern) if path.is_file())


def _man_files(*sections: str) -> Callable[[], list[Path]]:
    return lambda: _files(*((MAN / f"man{section}", "*.gz") for section in sections))


def _readme_files() -> list[Path]:
    return _files((Path(sysconfig.get_paths()["purelib"]), "*.dist-info/METADATA"))


SUBSETS: dict[str, Callable[[], list[Path]]] = {
    "man_commands": _man_files("1"),
    "man_syscalls": _man_files("2"),
    "man_library": _man_files("3"),
    "man_formats": _man_files("4", "5"),
    "man_overviews": _man_files("7"),
    "man_admin": _man_files("8"),
    "debian_changelogs": lambda: _files((DOC, "*/changelog.Debian.gz")),
    "package_readmes": _readme_files,
    "debian_readmes": lambda: _files((DOC, "*/README*")),
}
"""Subset -> the files it is sampled from, on this machine."""
INSTALL_HINT = {"man": "install Debian's manpages and manpages-dev (.ci/run does)"}


@dataclass(frozen=True)
class EvalSuiteTextConfig:
    output_path: str
    """Where subsets/ and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    subsets: list[str]
    """Which of `SUBSETS` to build (at least one). Versioned."""
    bytes_per_subset: int = 16_000
    """Stop sampling a subset once it holds this many bytes of text: enough for the suite's token cap, and
    little for decontamination to remove. Versioned."""
    passage_words: int = 150
    """Passages are at most this many words (a longer paragraph is a passage of its own). Versioned."""
    passages_per_file: int = 2
    """At most this many passages from one file, so a subset spans several. Versioned."""


def build_eval_suite_text(config: EvalSuiteTextConfig) -> dict:
    """The step: writes each subset's passages and stats.json; returns the stats."""
    unknown = sorted(set(config.subsets) - set(SUBSETS))
    if unknown or not config.subsets:
        raise ValueError(f"eval suite text at {config.output_path}: subsets {unknown or config.subsets} are not "
                         f"among {sorted(SUBSETS)}; name at least one of those")  # fmt: skip
    stats: dict[str, dict] = {}
    for subset in config.subsets:
        passages = _sample(subset, SUBSETS[subset](), config)
        if not passages:
            hint = INSTALL_HINT["man"] if subset.startswith("man_") else "check that its files are installed"
            raise EvalSuiteSourceError(f"eval suite text at {config.output_path}: subset {subset} found no text on "
                                       f"this machine; {hint}")  # fmt: skip
        records = "".join(json.dumps({"id": pid, "text": text, "source": subset}) + "\n" for pid, text in passages)
        storage.write_atomic(storage.join(config.output_path, "subsets", subset, "passages.jsonl"), records)
        stats[subset] = {"passages": len(passages), "bytes": sum(len(text.encode()) for _, text in passages),
                         "ids": [pid for pid, _ in passages]}  # fmt: skip
        logger.info("eval suite subset %s: %d passages, %d bytes", subset, len(passages), stats[subset]["bytes"])
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), {"subsets": stats})
    return stats


def _sample(subset: str, files: list[Path], config: EvalSuiteTextConfig) -> list[tuple[str, str]]:
    """Passages of `files`, visited in hash order of their names, until the subset holds its bytes."""
    chosen: list[tuple[str, str]] = []
    held = 0
    named = {f"{path.parent.name}/{path.name}": path for path in files}  # METADATA, changelogs: one name each
    for name in sorted(named, key=lambda name: xxhash.xxh3_64_intdigest(name.encode())):
        for index, text in enumerate(_passages(_text_of(named[name]), config.passage_words)):
            if index >= config.passages_per_file or held >= config.bytes_per_subset:
                break
            chosen.append((f"{subset}/{name}#{index}", text))
            held += len(text.encode())
        if held >= config.bytes_per_subset:
            break
    return chosen


def _text_of(path: Path) -> str:
    """A file's prose: roff stripped from a man page, the README from METADATA, the file as it is otherwise."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    if MAN in path.parents:
        return roff_to_text(text)
    if path.name == "METADATA":
        _headers, _, body = text.partition("\n\n")  # the long description follows the headers
        return body
    return text


_ROFF_ESCAPES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\\((?:em|en)"), "-"),
    (re.compile(r"\\\((?:lq|rq|dq)"), '"'),
    (re.compile(r"\\\((?:oq|cq|aq)"), "'"),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),  # other named glyphs
    (re.compile(r"\\-"), "-"),
    (re.compile(r"\\e"), r"\\"),
    (re.compile(r"\\[&|^:%c]|\\s[-+]?\d"), ""),
    (re.compile(r"\\ "), " "),
]


def roff_to_text(source: str) -> str:
    """A man page's words without its markup: requests that only format are dropped, those that hold text
    (`.B word`, `.SH NAME`) keep it, escapes become characters; paragraph requests become blank lines. An
    `.so` page (an alias of another) has no text of its own."""
    lines: list[str] = []
    for line in source.splitlines():
        if line.startswith((".so ", "'so ")):
            return ""
        if line.startswith((".\\\"", "'\\\"", '.\\"')) or line.strip() in {".", "'"}:
            continue
        if line.startswith((".", "'")):
            request, _, rest = line[1:].partition(" ")
            if request in {"PP", "LP", "P", "SH", "SS", "TP", "IP", "sp", "br"}:
                lines.append("")
            if request in {"B", "I", "SM", "SB", "BR", "BI", "IB", "IR", "RB", "RI", "SH", "SS", "IP"}:
                line = rest.replace('"', "")
            else:
                continue
        for pattern, replacement in _ROFF_ESCAPES:
            line = pattern.sub(replacement, line)
        lines.append(line)
    return "\n".join(lines)


def _passages(text: str, max_words: int) -> Iterator[str]:
    """Paragraphs (each on a line of its own, its words joined by single spaces) gathered while they stay within
    `max_words` words; a longer paragraph is a passage by itself."""
    paragraphs: list[str] = []
    words = 0
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph_words = paragraph.split()
        if not paragraph_words:
            continue
        if paragraphs and words + len(paragraph_words) > max_words:
            yield "\n".join(paragraphs)
            paragraphs, words = [], 0
        paragraphs.append(" ".join(paragraph_words))
        words += len(paragraph_words)
    if paragraphs:
        yield "\n".join(paragraphs)
