"""Why a step's hash is what it is: its version dict, and a key-by-key diff against every other
version of the same step name already under the prefix (the outputs `<name>-*` beside it).

The diff flattens both version dicts to dotted keys (`config.tokenizer`, `dependencies[corpus]`,
`code_version`) and lists what was added, removed or changed; a changed dependency is named by
the dependency's step name, so a user can follow the chain upstream with another `explain`. The
version itself refers to a dependency as `DEP[i]`, its place in hash order; the flattened view says
`DEP[corpus]`, so an upstream change that reorders the dependencies shows no false differences.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from executor.dag.records import info_path
from executor.store import storage
from executor.store.events import StepStatus, status_path
from executor.store.layout import HASH_CHARS, INFO_FILE
from executor.store.lease import holder_lost_note
from executor.store.step_rows import StepState

_MISSING = object()
_DEP_REFERENCE = re.compile(r"^DEP\[(\d+)\]")


@dataclass(frozen=True)
class Difference:
    key: str
    other: Any
    """The value in the other version (`None` with `added=True` when it had none)."""
    this: Any
    added: bool = False
    removed: bool = False

    def render(self) -> str:
        if self.added:
            return f"{self.key}: added here = {_show(self.this)}"
        if self.removed:
            return f"{self.key}: removed here (was {_show(self.other)})"
        return f"{self.key}: {_show(self.other)} there -> {_show(self.this)} here"


@dataclass
class OtherVersion:
    label: str
    output_path: str
    status: str | None
    written: str | None
    differences: list[Difference]
    digest: str | None = None


@dataclass
class ExplainReport:
    label: str
    output_path: str
    version: dict[str, Any]
    hash: str
    status: str | None = None
    drift: str | None = None
    """A sentence when the code that wrote a SUCCESS output differs from the current code."""
    digest: str | None = None
    """The output digest its SUCCESS recorded (sha256 of the canonical manifest)."""
    others: list[OtherVersion] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"{self.label}  ({self.output_path})  status: {self.status or 'never ran'}", "version:"]
        for key, value in sorted(flatten_version(self.version).items()):
            lines.append(f"  {key} = {_show(value)}")
        lines.append(f"hash: sha256 of the canonical JSON of the version = {self.hash}")
        lines.append(f"output digest: sha256 of the canonical manifest (paths, sizes, sha256s) = {_digest(self)}")
        if self.drift:
            lines.append(f"code drift: {self.drift}")
        name = self.version.get("name", "?")
        if not self.others:
            lines.append(f"no other version of {name!r} is stored beside it")
        else:
            lines.append(f"compared with {len(self.others)} other version(s) of {name!r} beside it (nearest first):")
        for other in self.others:
            count = len(other.differences)
            digest = f", digest {other.digest[:12]}" if other.digest else ""
            lines.append(
                f"  {other.label} ({other.status or 'never ran'}, written {other.written or '?'}{digest}): "
                f"{count} difference{'s' if count != 1 else ''}"
            )
            lines.extend(f"    {difference.render()}" for difference in other.differences)
        return "\n".join(lines)


def _digest(report: ExplainReport) -> str:
    if report.digest:
        return report.digest
    if report.status == StepStatus.SUCCESS:
        return "none recorded (it finished before output digests were; force_run it to record one)"
    return "none yet (recorded when the step succeeds)"


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _dependency_names(entries: list[str]) -> list[tuple[str, str]]:
    """(name, short hash) of each `name-hash` entry; a name that two dependencies share gets `@hash`."""
    pairs = []
    for entry in entries:
        dep_name, _, dep_hash = entry.rpartition("-")
        pairs.append((dep_name, dep_hash[:HASH_CHARS]) if dep_name else (entry, entry))
    counts = Counter(dep_name for dep_name, _short in pairs)
    return [(f"{name}@{short}" if counts[name] > 1 else name, short) for name, short in pairs]


def _name_dependency(value: Any, names: list[tuple[str, str]]) -> Any:
    """`DEP[1]/docs` -> `DEP[corpus]/docs`: positions follow the dependencies' hashes, names do not."""
    match = _DEP_REFERENCE.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) >= len(names):
        return value
    return f"DEP[{names[int(match.group(1))][0]}]{value[match.end() :]}"


def flatten_version(version: dict[str, Any]) -> dict[str, Any]:
    """`{"config.lr": 0.1, "config.data": "DEP[corpus]/docs", "dependencies[corpus]": "<hash>", "name": ...}`.

    A dependency's `DEP[i]` is shown by its step name: `i` is its place among the dependencies sorted by
    hash, so an upstream change that reorders them must not look like a change of every input path."""
    flat: dict[str, Any] = {"name": version.get("name"), "code_version": version.get("code_version")}
    names = _dependency_names(version.get("dependencies") or [])
    for key, value in (version.get("config") or {}).items():
        flat[f"config.{key}"] = _name_dependency(value, names)
    for dep_name, short_hash in names:
        flat[f"dependencies[{dep_name}]"] = short_hash
    return flat


def diff_versions(other: dict[str, Any], this: dict[str, Any]) -> list[Difference]:
    old, new = flatten_version(other), flatten_version(this)
    differences = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, _MISSING), new.get(key, _MISSING)
        if before is _MISSING:
            differences.append(Difference(key, None, after, added=True))
        elif after is _MISSING:
            differences.append(Difference(key, before, None, removed=True))
        elif before != after:
            differences.append(Difference(key, before, after))
    return differences


def sibling_outputs(output_path: str, name: str) -> list[str]:
    """Other outputs `<name>-<hash>` in the same folder as `output_path`."""
    parent = storage.dirname(output_path)
    stem = storage.basename(name) + "-"
    return [
        storage.join(parent, entry)
        for entry in storage.list_names(parent)
        if entry.startswith(stem) and storage.join(parent, entry) != output_path.rstrip("/")
    ]


def explain(
    output_path: str, version: dict[str, Any], full_hash: str, current_fingerprint: str | None = None
) -> ExplainReport:
    """Explain the step whose version is `version` and whose output is (or would be) at `output_path`."""
    name = version["name"]
    siblings = sibling_outputs(output_path, name)
    blobs = storage.read_many([status_path(output_path)] + [storage.join(p, INFO_FILE) for p in siblings])
    blobs += storage.read_many([status_path(p) for p in siblings])
    own_status, sibling_infos, sibling_statuses = blobs[0], blobs[1 : 1 + len(siblings)], blobs[1 + len(siblings) :]
    state = StepState.read(own_status, output_path)
    report = ExplainReport(
        label=storage.basename(output_path),
        output_path=output_path,
        version=version,
        hash=full_hash,
        status=state.status,
        digest=state.digest,
    )
    if state.status == StepStatus.RUNNING:
        lost = holder_lost_note(output_path, state.started)
        report.status = f"RUNNING - {lost}" if lost else report.status
    if state.drifted(current_fingerprint):
        report.drift = (
            "the step function's source changed since this output was written; the output is kept "
            "(code is not hashed). Bump code_version or force_run the step to rebuild it."
        )
    for path, info_blob, status_blob in zip(siblings, sibling_infos, sibling_statuses, strict=True):
        if info_blob is None:
            continue
        info = json.loads(info_blob)
        if info.get("name") != name:
            continue
        other = StepState.read(status_blob, path)
        report.others.append(
            OtherVersion(
                label=storage.basename(path),
                output_path=path,
                status=other.status,
                written=info.get("written"),
                differences=diff_versions(info.get("version") or {}, version),
                digest=other.digest,
            )
        )
    report.others.sort(key=lambda other: (len(other.differences), other.label))
    return report


def explain_output(output_path: str, current_fingerprint: str | None = None) -> ExplainReport:
    """Explain a step from what its output folder holds (its `.executor_info`)."""
    output_path = storage.make_absolute(output_path)
    info = storage.read_json(info_path(output_path))
    if info is None:
        raise FileNotFoundError(
            f"{output_path} has no {INFO_FILE}: it is not a step output (or the step was never started)"
        )
    return explain(output_path, info["version"], info["hash"], current_fingerprint)
