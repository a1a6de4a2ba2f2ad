"""One shard of a fanned-out step: where it writes, how it commits, the marker that says it is done.

A shard function writes only through its `ShardWriter`: files land under
`<output>/.executor_tmp/<shard>-<attempt>/` and, once the function returns, move to their final names (a
folder the shard asked for with `out.folder(...)`, such as a Levanter cache, moves whole); then
`<output>/.executor_shards/<shard>.json` records the files (size, sha256), rows and stats.
`run_one_shard` is that sequence, with retries, in whichever worker runs the shard: a process of a local
pool or a Ray task. Scheduling shards and reporting progress is `executor/shards/runner.py`'s (and
`executor/shards/ray_tasks.py`'s) business; both import this module, which imports neither.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from executor.errors import ExecutorError
from executor.retry import RetryPolicy
from executor.store import storage
from executor.store.events import now_iso
from executor.store.layout import SHARD_DIR, TEMP_DIR

logger = logging.getLogger(__name__)

_SHARD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
PROGRESS_INTERVAL_S = 1.0


def valid_shard_id(shard_id: str) -> bool:
    """Letters, digits, `_`, `.` and `-`, not starting with a punctuation mark: safe as a file name anywhere."""
    return bool(_SHARD_ID.match(shard_id))


ShardFn = Callable[[Any, "ShardWriter"], dict[str, Any] | None]


class ShardFailedError(ExecutorError):
    """A shard's function raised (after any retries); committed shards stay committed."""


@dataclass(frozen=True)
class Shard:
    shard_id: str
    """Stable and unique within the step (it names the marker): e.g. "00042" or an input file's stem."""
    payload: Any = None
    """What the shard function receives: an input path, a range, parameters. Must pickle."""


class _HashingWriter:
    """A binary file that computes its sha256 and size as it is written."""

    def __init__(self, handle: IO[bytes], on_close: Callable[[str, int], None]):
        self._handle = handle
        self._digest = hashlib.sha256()
        self._size = 0
        self._on_close = on_close

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        self._size += len(data)
        return self._handle.write(data)

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()
            self._on_close(self._digest.hexdigest(), self._size)

    def __enter__(self) -> _HashingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ShardWriter:
    """Where a shard writes: temp paths that are committed (moved) only if the shard succeeds."""

    def __init__(self, output_path: str, shard_id: str):
        self.output_path = output_path
        self.shard_id = shard_id
        self.temp_root = storage.join(output_path, TEMP_DIR, f"{shard_id}-{uuid.uuid4().hex[:8]}")
        self._files: dict[str, tuple[str, int] | None] = {}
        self._folders: set[str] = set()

    def _check(self, relative: str) -> None:
        if relative.startswith("/") or ".." in relative.split("/") or not relative:
            raise ValueError(f"shard {self.shard_id}: output name {relative!r} must be a relative path inside the step")

    def path(self, relative: str) -> str:
        """A temp path to write `relative` (relative to the step's output) to, by any library."""
        self._check(relative)
        self._files.setdefault(relative, None)
        temp = storage.join(self.temp_root, relative)
        storage.makedirs(storage.dirname(temp))
        return temp

    def folder(self, relative: str) -> str:
        """A temp folder that becomes `relative` as a whole, with whatever files are in it at commit (written
        by any library: a Levanter cache, a checkpoint). Locally it is committed by one rename, however
        many files and subfolders it holds; the final folder must not be shared with another shard."""
        self._check(relative)
        self._folders.add(relative)
        temp = storage.join(self.temp_root, relative)
        storage.makedirs(temp)
        return temp

    def open(self, relative: str) -> _HashingWriter:
        """Open `relative` for binary writing; its checksum is computed as it is written."""
        temp = self.path(relative)
        fs, fs_path = storage.filesystem(temp)

        def record(digest: str, size: int) -> None:
            self._files[relative] = (digest, size)

        return _HashingWriter(fs.open(fs_path, "wb"), record)

    def commit(self) -> list[dict[str, Any]]:
        """Move every written file and folder to its final name; return their files' manifest entries."""
        entries = []
        for relative, known in sorted(self._files.items()):
            temp = storage.join(self.temp_root, relative)
            digest, size = known if known is not None else (storage.sha256_file(temp), _size(temp))
            storage.move(temp, storage.join(self.output_path, relative))
            entries.append({"path": relative, "size": size, "sha256": digest})
        for relative in sorted(self._folders):
            temp = storage.join(self.temp_root, relative)
            for name, size in storage.walk_files(temp):
                digest = storage.sha256_file(storage.join(temp, name))
                entries.append({"path": f"{relative}/{name}", "size": size, "sha256": digest})
            storage.move_tree(temp, storage.join(self.output_path, relative))
        storage.delete(self.temp_root, recursive=True)
        return sorted(entries, key=lambda entry: entry["path"])

    def discard(self) -> None:
        storage.delete(self.temp_root, recursive=True)


def _size(path: str) -> int:
    fs, fs_path = storage.filesystem(path)
    return int(fs.size(fs_path) or 0)


def marker_path(output_path: str, shard_id: str) -> str:
    return storage.join(output_path, SHARD_DIR, f"{shard_id}.json")


def run_one_shard(
    output_path: str, shard: Shard, fn: ShardFn, retry: RetryPolicy, generation: int | None = None
) -> dict[str, Any]:
    """Run, commit and mark one shard (in whichever worker runs it) as part of output `generation`."""
    attempt = 1
    while True:
        writer = ShardWriter(output_path, shard.shard_id)
        try:
            stats = fn(shard.payload, writer) or {}
            files = writer.commit()
            break
        except Exception as error:
            writer.discard()
            if not retry.should_retry(error, attempt):
                raise ShardFailedError(f"shard {shard.shard_id} of {output_path} failed: {error!r}") from error
            wait_s = retry.backoff_s(attempt)
            logger.warning("shard %s: %r; attempt %d, retrying in %.1fs", shard.shard_id, error, attempt, wait_s)
            time.sleep(wait_s)
            attempt += 1
    marker = {
        "shard_id": shard.shard_id,
        "files": files,
        "rows": int(stats.get("rows", 0)),
        "bytes": sum(entry["size"] for entry in files),
        "stats": stats,
        "attempts": attempt,
        "generation": generation,
        "worker": f"{os.uname().nodename}:{os.getpid()}",
        "committed": now_iso(),
    }
    storage.write_json_atomic(marker_path(output_path, shard.shard_id), marker)
    return marker


def read_shard_markers(output_path: str) -> dict[str, dict[str, Any]]:
    """Markers of the committed shards, by shard id (one listing plus parallel reads)."""
    folder = storage.join(output_path, SHARD_DIR)
    names = [name for name in storage.list_names(folder) if name.endswith(".json")]
    blobs = storage.read_many(storage.join(folder, name) for name in names)
    markers = {}
    for name, blob in zip(names, blobs, strict=True):
        if blob is not None:
            markers[name.removesuffix(".json")] = json.loads(blob)
    return markers
