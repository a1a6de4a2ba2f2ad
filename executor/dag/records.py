"""The JSON records the executor writes: `.executor_info`, the experiment file, and the manifest with its digest.

Resolved configs are written with `identity.readable_value`, the encoder versions use, loosened to
write what has no canonical form as its `repr`: one canonicalizer, strict JSON in every record."""

from __future__ import annotations

import functools
import getpass
import hashlib
import logging
import os
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from executor.dag.identity import canonical_json, readable_value
from executor.dag.plan import Plan, PlannedStep
from executor.shards.writer import read_shard_markers
from executor.store import storage
from executor.store.events import now_iso
from executor.store.layout import HASH_CHARS, INFO_FILE, MANIFEST_FILE, STATUS_FILE, is_executor_record, is_metadata

logger = logging.getLogger(__name__)


GIT_COMMIT_ENV = "EXECUTOR_GIT_COMMIT"


@functools.cache
def git_commit() -> str | None:
    """The commit of the code being run: $EXECUTOR_GIT_COMMIT (set it when submitting to a cluster,
    where the working dir has no .git), else `git rev-parse HEAD`."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


@functools.cache
def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


VECTOR_EXTENSIONS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"), ("sve", "SVE"),
                     ("asimd", "NEON"))  # fmt: skip
"""/proc/cpuinfo's flag of each vector extension, widest first, and its name. XLA compiles for the CPU it runs on,
and another extension rounds a sum otherwise: a trained loss is the same to the bit on one machine and differs in
its last bits on another, so a step's record and a benchmark's name the extension."""


def cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (Linux; empty elsewhere)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    break  # the first processor's block ends
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model(fields: dict[str, str]) -> str:
    """The CPU's model name as /proc/cpuinfo gives it (Linux), else what `platform` knows."""
    if fields.get("model name"):
        return fields["model name"]
    import platform

    return platform.processor() or platform.machine()


def cpu_id(fields: dict[str, str]) -> str | None:
    """The CPU's family and model ("family 25 model 1"): what tells one generation from another where a virtual
    machine masks the model name ("AMD EPYC" for several); None where /proc/cpuinfo has no such fields (ARM)."""
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"family {fields['cpu family']} model {fields['model']}"


def vector_isa(fields: dict[str, str]) -> str | None:
    """The widest vector extension the CPU has (`VECTOR_EXTENSIONS`), None where /proc/cpuinfo lists no flags."""
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return next((name for flag, name in VECTOR_EXTENSIONS if flag in flags), None)


@functools.cache
def this_cpu() -> dict[str, Any]:
    """The CPU this process runs on, as `.executor_info` records it under `machine` (and the benchmarks' results):
    its cores, model name, family and model, and widest vector extension."""
    fields = cpuinfo()
    return {"cores": os.cpu_count(), "cpu_model": cpu_model(fields), "cpu_id": cpu_id(fields),
            "vector_isa": vector_isa(fields)}  # fmt: skip


def cpu_words(machine: dict[str, Any]) -> str:
    """A machine record's CPU in words ("AMD EPYC, family 25 model 1, AVX2"): its model name, then its family and
    vector extension where recorded (an older record has the name alone)."""
    words = [machine.get("cpu_model"), machine.get("cpu_id"), machine.get("vector_isa")]
    return ", ".join(str(word) for word in words if word)


def step_info(planned: PlannedStep, *, worker: str | None = None, started: str | None = None) -> dict[str, Any]:
    step = planned.step
    return {
        "name": planned.name,
        "fn": planned.fn_name,
        "description": step.description,
        "config": readable_value(planned.config),
        "version": planned.version,
        "hash": planned.hash,
        "output_path": planned.output_path,
        "dependencies": [
            {"name": dep.name, "output_path": dep.output_path, "blocking": dep in planned.blocking}
            for dep in planned.dependencies
        ],
        "code_fingerprint": planned.fingerprint,
        "code_version": step.code_version,
        "resources": readable_value(step.resources),
        "git_commit": git_commit(),
        "user": user_name(),
        "host": socket.gethostname(),
        "worker": worker,
        "written": now_iso(),
        "started": started,
    }


def info_path(output_path: str) -> str:
    return storage.join(output_path, INFO_FILE)


def recorded_path(path: str, output_path: str, folder: str | None = None) -> str:
    """`path` as the step writing `output_path` names it in its files: relative to `folder` (default: the output
    itself) when it lies under the step's prefix (another step's output of the same DAG, e.g. the files a
    download copied, the tokenizer a cache was made with), so the same DAG under another prefix, or a copied
    prefix, holds the same bytes (`storage.resolve_portable` gives the path back); any other path unchanged. The
    prefix is read from the output's `.executor_info` (a step function called outside an executor has none)."""
    prefix = _prefix_of(storage.make_absolute(output_path))
    if prefix is None or not storage.make_absolute(path).startswith(prefix + "/"):
        return path
    return storage.portable_path(storage.make_absolute(path), storage.make_absolute(folder or output_path))


@functools.lru_cache(maxsize=64)
def _prefix_of(output_path: str) -> str | None:
    info = storage.read_json(info_path(output_path))
    if not isinstance(info, dict) or not isinstance(info.get("name"), str) or not isinstance(info.get("hash"), str):
        return None
    suffix = f"/{info['name']}-{info['hash'][:HASH_CHARS]}"
    if storage.make_absolute(str(info.get("output_path", ""))) != output_path or not output_path.endswith(suffix):
        return None  # an override_output_path: no prefix of the DAG's
    return output_path.removesuffix(suffix)


def experiment_record(plan: Plan, *, caller: str, description: str | None) -> dict[str, Any]:
    return {
        "caller": caller,
        "description": description,
        "git_commit": git_commit(),
        "user": user_name(),
        "created": now_iso(),
        "steps": [
            {
                "name": planned.name,
                "hash": planned.hash,
                "output_path": planned.output_path,
                "status_path": storage.join(planned.output_path, STATUS_FILE),
                "fn": planned.fn_name,
                "code_fingerprint": planned.fingerprint,
                "version": planned.version,
                "config": readable_value(planned.config),
                "description": planned.step.description,
                "requested": planned in plan.requested,
                "dependencies": [
                    {"output_path": dep.output_path, "blocking": dep in planned.blocking}
                    for dep in planned.dependencies
                ],
            }
            for planned in plan.steps
        ],
    }


def experiment_file_name(plan: Plan, caller: str) -> str:
    script = os.path.splitext(os.path.basename(caller))[0] or "experiment"
    identity = hashlib.sha256(canonical_json(sorted(p.hash for p in plan.steps)).encode()).hexdigest()
    return f"{script}-{identity[:8]}.json"


def output_files(output_path: str) -> list[tuple[str, int]]:
    """(relative path, size) of the step's own output files: everything but the executor's records."""
    return [
        (path, size) for path, size in storage.walk_files(output_path, skip=is_metadata) if not is_executor_record(path)
    ]


def write_manifest(output_path: str) -> dict[str, Any]:
    """List every output file with its size and sha256, then write `.executor_manifest`.

    Files committed by `run_sharded` already have their checksum in a shard marker; only the
    others are read and hashed.
    """
    files = output_files(output_path)
    known = {
        entry["path"]: (entry["size"], entry["sha256"])
        for marker in read_shard_markers(output_path).values()
        for entry in marker["files"]
    }

    def digest(relative: str, size: int) -> str:
        if relative in known and known[relative][0] == size:
            return known[relative][1]
        return storage.sha256_file(storage.join(output_path, relative))

    with ThreadPoolExecutor(max_workers=min(storage.IO_THREADS, max(1, len(files)))) as pool:
        digests = list(pool.map(lambda item: digest(*item), files))
    entries = [
        {"path": relative, "size": size, "sha256": digest}
        for (relative, size), digest in zip(files, digests, strict=True)
    ]
    manifest = {
        "written": now_iso(),
        "files": entries,
        "total_bytes": sum(size for _relative, size in files),
        "digest": output_digest(entries),
    }
    storage.write_json_atomic(storage.join(output_path, MANIFEST_FILE), manifest)
    return manifest


def hash_files(output_path: str) -> list[dict[str, Any]]:
    """Manifest entries (path, size, sha256) of the output files as they are now, every one read and hashed: what
    `compare` and a pinned run judge by, since a file edited after its step committed leaves the manifest as it was."""
    files = output_files(output_path)
    with ThreadPoolExecutor(max_workers=min(storage.IO_THREADS, max(1, len(files)))) as pool:
        digests = list(pool.map(lambda item: storage.sha256_file(storage.join(output_path, item[0])), files))
    return [{"path": path, "size": size, "sha256": digest} for (path, size), digest in zip(files, digests, strict=True)]


def output_digest(files: list[dict[str, Any]]) -> str:
    """The step's output digest: the sha256 of the canonical JSON of its manifest's files (path, size, sha256),
    sorted by path. Equal digests mean the same bytes under the same names; when the manifest was written, by whom
    and where play no part, so two machines that computed the same output agree."""
    entries = [{"path": entry["path"], "size": entry["size"], "sha256": entry["sha256"]} for entry in files]
    entries.sort(key=lambda entry: entry["path"])
    return hashlib.sha256(canonical_json(entries).encode()).hexdigest()


def clear_outputs(output_path: str) -> list[str]:
    """Delete the step's own outputs and its manifest, keeping the executor's records; the names deleted.

    A forced rerun calls this once it holds the lease and has recorded its RUNNING event, so it starts
    from an empty folder: a file the old run (or a user) left there can neither survive into the new
    output nor into its manifest. Shard markers stay: `run_sharded` drops those older than the forced
    attempt itself, and an ordinary resume keeps them with their shards.
    """
    names = [name for name in storage.list_names(output_path) if not is_metadata(name)]
    for name in names:
        storage.delete(storage.join(output_path, name), recursive=True)
    storage.delete(storage.join(output_path, MANIFEST_FILE))
    return names


def verify_manifest(output_path: str) -> list[str]:
    """Problems found when recomputing a finished step's checksums; empty means all is well."""
    manifest = storage.read_json(storage.join(output_path, MANIFEST_FILE))
    if manifest is None:
        return [f"{output_path}: no {MANIFEST_FILE}; the step never finished (or predates manifests)"]
    problems = []
    for entry in manifest["files"]:
        path = storage.join(output_path, entry["path"])
        if not storage.exists(path):
            problems.append(f"missing: {path}")
            continue
        digest = storage.sha256_file(path)
        if digest != entry["sha256"]:
            problems.append(f"corrupt: {path} (sha256 {digest[:12]}…, manifest says {entry['sha256'][:12]}…)")
    listed = {entry["path"] for entry in manifest["files"]}
    for relative, _size in output_files(output_path):
        if relative not in listed:
            problems.append(f"not in manifest: {storage.join(output_path, relative)}")
    return problems
