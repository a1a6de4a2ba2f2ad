"""Whether files that differ in bytes hold the same result: what `compare` looks into once two digests differ.

Two runs of one step can write other bytes for the same result in three ways, none of which says anything about
what the step computed:

- **Measured times** in a JSON or JSONL file (`throughput/duration`, `eval/loading_time`, a checkpoint's
  `timestamp`, a seal's `sealed_at`: a key whose last part is named like `MEASURED_KEY`), and **the prefix** the
  output lies under written into it (an evaluation's `checkpoint` path): both are set aside, every other value
  must be equal (or, given `rtol`, equal within it).
- **An OCDBT database** (a tensorstore / orbax checkpoint: `manifest.ocdbt` and data files under `d/`) names its
  data files at random: it is compared by its keys and values, read through tensorstore, so two checkpoints of
  the same arrays are the same result and one changed weight is not.
- **Records of the run** (`RUN_RECORD_DIRS`: wandb's offline runs, their console, system metrics and times)
  say how a run went, not what it computed: they are counted, not compared.

Each finding is a `Verdict`: `compare` calls a step `same` when every differing file is equivalent, and says
which and why; `--bytes` asks for the same bytes instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from executor.store import storage

MEASURED_KEY = re.compile(r"^(time|timestamp|duration|elapsed|\w+_time|\w+_at|\w+_per_second|\w+_seconds)$")
"""The last part (after `/` or `.`) of a key that holds a measured time or rate, never a result."""

RUN_RECORD_DIRS = ("wandb",)
"""Top-level output folders that record how a run went (wandb's offline runs), not what it computed."""

DATABASE_MARKER = "manifest.ocdbt"
"""The file at an OCDBT database's root; its data files lie under `d/` beside it."""


@dataclass(frozen=True)
class Verdict:
    equivalent: bool
    note: str | None = None
    relative: float = 0.0
    """With rtol: the largest relative difference between the two files' figures."""


def is_run_record(path: str) -> bool:
    return path.split("/", 1)[0] in RUN_RECORD_DIRS


def database_of(path: str, roots: set[str]) -> str | None:
    """The OCDBT database folder (one of `roots`) that `path` belongs to, if any."""
    for root in roots:
        if path == f"{root}/{DATABASE_MARKER}" or path.startswith(f"{root}/d/"):
            return root
    return None


def database_roots(paths: set[str]) -> set[str]:
    """The folders, relative to the output, that hold an OCDBT database."""
    return {path[: -len(DATABASE_MARKER) - 1] for path in paths if path.endswith("/" + DATABASE_MARKER)}


def database_digest(folder: str) -> tuple[int, str] | None:
    """(keys, sha256 over every key and its value's sha256) of the OCDBT database at `folder`; None where
    tensorstore cannot open that storage (fsspec's `memory://`), so the caller compares bytes instead."""
    spec = _kvstore_spec(storage.make_absolute(folder))
    if spec is None:
        return None
    import tensorstore  # a checkpoint reader's dependency: imported only when a database is compared

    store = tensorstore.KvStore.open({"driver": "ocdbt", "base": spec}).result()
    keys = sorted(store.list().result())
    digest = hashlib.sha256()
    for key in keys:
        digest.update(key + b"\0" + hashlib.sha256(store.read(key).result().value).digest())
    return len(keys), digest.hexdigest()


def _kvstore_spec(folder: str) -> dict[str, str] | None:
    if "://" not in folder:
        return {"driver": "file", "path": folder.rstrip("/") + "/"}
    protocol, rest = folder.split("://", 1)
    bucket, _, path = rest.partition("/")
    if protocol in ("gs", "gcs"):
        return {"driver": "gcs", "bucket": bucket, "path": path.rstrip("/") + "/"}
    if protocol == "s3":
        return {"driver": "s3", "bucket": bucket, "path": path.rstrip("/") + "/"}
    return None


def compare_databases(folder_a: str, folder_b: str) -> Verdict:
    found_a, found_b = database_digest(folder_a), database_digest(folder_b)
    if found_a is None or found_b is None:
        return Verdict(False, "an OCDBT database on storage tensorstore cannot open: compared byte for byte")
    if found_a == found_b:
        return Verdict(True, f"an OCDBT database (checkpoint): other file names, the same {found_a[0]} keys and values")
    return Verdict(False, f"an OCDBT database (checkpoint): {found_a[0]} and {found_b[0]} keys, other values")


def compare_json(
    name: str, text_a: str, text_b: str, prefixes: tuple[str, str], rtol: float | None, settle: bool = True
) -> Verdict:
    """Whether two JSON (or, for `.jsonl`, JSON-lines) documents agree, exactly or within `rtol`, once (with
    `settle`) measured times and each side's own prefix are set aside; the note says what was set aside, or where
    they differ."""
    lines = name.endswith(".jsonl")
    try:
        doc_a = [json.loads(line) for line in text_a.splitlines() if line.strip()] if lines else json.loads(text_a)
        doc_b = [json.loads(line) for line in text_b.splitlines() if line.strip()] if lines else json.loads(text_b)
    except ValueError:
        return Verdict(False, first_differing_line(text_a, text_b) if lines else None)
    measured: set[str] = set()
    moved: list[bool] = []
    if settle:
        doc_a, doc_b = _settled(doc_a, prefixes[0], measured, moved), _settled(doc_b, prefixes[1], measured, moved)
    largest = [0.0]
    if not _agree(doc_a, doc_b, rtol or 0.0, largest):
        return Verdict(False, _first_disagreeing_record(text_a, text_b, doc_a, doc_b, rtol) if lines else None)
    set_aside = []
    if rtol is not None and largest[0]:
        set_aside.append(f"equal within rtol {rtol:g}: largest relative difference {largest[0]:.3g}")
    if measured:
        shown = ", ".join(sorted(measured)[:4]) + (f" and {len(measured) - 4} more" if len(measured) > 4 else "")
        set_aside.append(f"measured times set aside ({shown})")
    if moved and prefixes[0] != prefixes[1]:
        set_aside.append("paths under each side's own prefix read as <prefix>")
    return Verdict(True, "; ".join(set_aside) or "the same values, written otherwise", largest[0])


def _settled(value: Any, prefix: str, measured: set[str], moved: list[bool], key: str = "") -> Any:
    """`value` without its measured times (their keys added to `measured`), and with its own prefix written as
    `<prefix>` (`moved` gains an entry where one was)."""
    if isinstance(value, dict):
        kept = {}
        for name, item in value.items():
            path = f"{key}.{name}" if key else str(name)
            if MEASURED_KEY.match(re.split(r"[/.]", str(name))[-1]):
                measured.add(path)
                continue
            kept[name] = _settled(item, prefix, measured, moved, path)
        return kept
    if isinstance(value, list):
        return [_settled(item, prefix, measured, moved, key) for item in value]
    base = prefix.rstrip("/") + "/"
    if isinstance(value, str) and prefix and base in value:
        moved.append(True)
        return value.replace(base, "<prefix>/")
    return value


def _first_disagreeing_record(text_a: str, text_b: str, doc_a: list[Any], doc_b: list[Any], rtol: float | None) -> str:
    """The first line whose values disagree once times are set aside, as written (so a difference in a loss is not
    hidden behind the times every line differs in)."""
    lines_a = [line for line in text_a.splitlines() if line.strip()]
    lines_b = [line for line in text_b.splitlines() if line.strip()]
    for number, (record_a, record_b) in enumerate(zip(doc_a, doc_b, strict=False), start=1):
        if not _agree(record_a, record_b, rtol or 0.0, [0.0]):
            return f"first differing line {number}: A {_clip(lines_a[number - 1])} | B {_clip(lines_b[number - 1])}"
    return f"A has {len(doc_a)} lines, B {len(doc_b)}; the first {min(len(doc_a), len(doc_b))} agree"


def first_differing_line(text_a: str, text_b: str) -> str:
    lines_a, lines_b = text_a.splitlines(), text_b.splitlines()
    for number, (line_a, line_b) in enumerate(zip(lines_a, lines_b, strict=False), start=1):
        if line_a != line_b:
            return f"first differing line {number}: A {_clip(line_a)} | B {_clip(line_b)}"
    return f"A has {len(lines_a)} lines, B {len(lines_b)}; the first {min(len(lines_a), len(lines_b))} agree"


def _clip(line: str, chars: int = 160) -> str:
    return line if len(line) <= chars else line[:chars] + "…"


def _agree(a: Any, b: Any, rtol: float, largest: list[float]) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        if a == b or (math.isnan(a) and math.isnan(b)):
            return True
        relative = abs(a - b) / max(abs(a), abs(b))
        largest[0] = max(largest[0], relative)
        return relative <= rtol
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_agree(a[key], b[key], rtol, largest) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_agree(x, y, rtol, largest) for x, y in zip(a, b, strict=True))
    return bool(a == b)
