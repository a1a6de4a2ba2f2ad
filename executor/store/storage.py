"""All executor I/O, through fsspec: reads, atomic writes, exclusive creates, listings, checksums.

Paths are full URLs (`gs://bucket/x`, `s3://b/x`, `memory://x`) or absolute local paths.
Two primitives carry the executor's safety, and both exist on every store we support:

- `write_atomic`: a reader sees the old bytes or the new bytes, never a torn file (local: temp
  file + rename; object stores: a single PUT).
- `create_exclusive`: create-if-absent, where exactly one of many concurrent creators wins
  (local: `link(2)` of a finished temp file, which fails if the name exists; GCS:
  `ifGenerationMatch=0`; S3: `If-None-Match: *`; memory: a process-wide lock).

No compare-and-swap on an existing object is assumed anywhere. Every call here retries transient
failures (429, 5xx, dropped connections) with backoff; see retry.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from executor.retry import call_with_retry

_MEMORY_CREATE_LOCK = threading.Lock()
_CHUNK = 8 * 1024 * 1024
IO_THREADS = 32
"""Parallel metadata reads; object stores reward many requests in flight."""
ASYNC_BATCH = 32
"""Requests in flight at once on an async client; more only queues up at the server."""


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, fs_path = fsspec.core.url_to_fs(path)
    return fs, fs_path


def is_url(path: str) -> bool:
    return "://" in path


def on_local_disk(path: str) -> bool:
    """A plain path or a file:// / local:// URL: a folder on this machine's disk, not an object store."""
    return not is_url(path) or path.startswith(("file://", "local://"))


def make_absolute(path: str) -> str:
    """Local paths become absolute; URLs are returned unchanged (minus a trailing slash)."""
    if is_url(path):
        return path.rstrip("/") if not path.endswith("://") else path
    return os.path.abspath(os.path.expanduser(path))


def join(base: str, *parts: str) -> str:
    path = base.rstrip("/")
    for part in parts:
        if part:
            path = f"{path}/{part.strip('/')}"
    return path


def _store_and_key(path: str) -> tuple[str, str]:
    """(the store: `protocol://bucket`, or "" for this machine's disk; the path inside it, from its root)."""
    if on_local_disk(path):
        return "", make_absolute(path.removeprefix("file://").removeprefix("local://"))
    protocol, rest = path.split("://", 1)
    bucket, _, key = rest.partition("/")
    return f"{protocol}://{bucket}", "/" + key


def portable_path(path: str, start: str) -> str:
    """`path` as a step records it in its output: relative to the folder `start` (its own output path) when both
    lie in one store (one bucket, or this machine's disk), else unchanged. Another step's output named this way
    is the same text under any prefix, so a copied or moved prefix, or the same DAG run under another prefix,
    holds the same bytes; `resolve_portable(recorded, start)` gives the path back."""
    (store, key), (start_store, start_key) = _store_and_key(path), _store_and_key(start)
    if store != start_store:
        return path
    return posixpath.relpath(key, start_key)


def resolve_portable(recorded: str, start: str) -> str:
    """The path `portable_path(path, start)` recorded (a relative one is joined to `start` and normalised)."""
    if is_url(recorded) or os.path.isabs(recorded):
        return recorded
    store, key = _store_and_key(start)
    resolved = posixpath.normpath(posixpath.join(key, recorded))
    return f"{store}{resolved}" if store else resolved


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/"))


def dirname(path: str) -> str:
    if is_url(path):
        protocol, rest = path.split("://", 1)
        return f"{protocol}://{posixpath.dirname(rest.rstrip('/'))}"
    return os.path.dirname(path.rstrip("/"))


def exists(path: str) -> bool:
    fs, fs_path = filesystem(path)
    return call_with_retry(lambda: fs.exists(fs_path), f"exists {path}")


def read_bytes(path: str) -> bytes | None:
    """The file's bytes, or None if it does not exist."""
    fs, fs_path = filesystem(path)

    def read() -> bytes | None:
        try:
            return fs.cat_file(fs_path)
        except FileNotFoundError:
            return None

    return call_with_retry(read, f"read {path}")


def read_text(path: str) -> str | None:
    data = read_bytes(path)
    return None if data is None else data.decode("utf-8", errors="replace")


def read_json(path: str) -> Any | None:
    data = read_bytes(path)
    return None if data is None else json.loads(data)


def read_many(paths: Iterable[str]) -> list[bytes | None]:
    """Read many small files concurrently (None for missing ones), never one round trip after another.

    On object stores with an async client (gcsfs, s3fs) the reads go out as one batch of
    concurrent requests on the client's event loop; elsewhere through a thread pool; local
    disk is read directly (threads only add overhead there).
    """
    paths = list(paths)
    if len(paths) <= 1 or not any(is_url(path) for path in paths):
        return [read_bytes(path) for path in paths]
    fs, _ = filesystem(paths[0])
    same_store = all(path.split("://", 1)[0] == paths[0].split("://", 1)[0] for path in paths)
    if same_store and getattr(fs, "async_impl", False):
        return _read_many_async(fs, paths)
    with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(paths))) as pool:
        return list(pool.map(read_bytes, paths))


def _read_many_async(fs: fsspec.AbstractFileSystem, paths: list[str]) -> list[bytes | None]:
    stripped = [fs._strip_protocol(path) for path in paths]
    found = fs.cat(sorted(set(stripped)), on_error="return", batch_size=ASYNC_BATCH)
    results: list[bytes | None] = []
    for path, key in zip(paths, stripped, strict=True):
        value = found.get(key) if isinstance(found, dict) else found
        if isinstance(value, FileNotFoundError):
            results.append(None)
        elif isinstance(value, BaseException):  # a transient failure of one request: retry it alone
            results.append(read_bytes(path))
        else:
            results.append(value)
    return results


def makedirs(path: str) -> None:
    fs, fs_path = filesystem(path)
    call_with_retry(lambda: fs.makedirs(fs_path, exist_ok=True), f"makedirs {path}")


def _local_temp_file(fs_path: str, payload: bytes) -> str:
    """Write `payload` to a fresh temp file beside `fs_path` (same folder: rename and link stay atomic)."""
    os.makedirs(os.path.dirname(fs_path), exist_ok=True)
    temp = f"{fs_path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(temp, "wb") as handle:
            handle.write(payload)
    except OSError as error:
        # A full disk (or a file-size limit) fails the write with no file name: leave no partial temp file
        # behind, and name the file being written (same errno, so retry decisions do not change).
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise OSError(error.errno, error.strerror, fs_path) from error
    return temp


def write_atomic(path: str, data: bytes | str) -> None:
    """Replace the file at `path` with `data`; readers never see a partial file."""
    payload = data.encode() if isinstance(data, str) else data
    fs, fs_path = filesystem(path)
    if isinstance(fs, LocalFileSystem):
        os.replace(_local_temp_file(fs_path, payload), fs_path)
    else:
        call_with_retry(lambda: fs.pipe_file(fs_path, payload), f"write {path}")


def create_exclusive(path: str, data: bytes | str) -> bool:
    """Create `path` holding `data` if it does not exist. True if this call created it.

    After a retried request, False can also mean "our own first try created it and its answer
    was lost": callers that must know (leases) read the object back and compare.
    """
    payload = data.encode() if isinstance(data, str) else data
    fs, fs_path = filesystem(path)
    if isinstance(fs, LocalFileSystem):
        temp = _local_temp_file(fs_path, payload)
        try:
            os.link(temp, fs_path)  # atomic, fails if the name exists; readers never see it half-written
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)
    if isinstance(fs, MemoryFileSystem):
        with _MEMORY_CREATE_LOCK:
            if fs.exists(fs_path):
                return False
            fs.pipe_file(fs_path, payload)
            return True

    def create() -> bool:
        try:
            fs.pipe_file(fs_path, payload, mode="create")
            return True
        except FileExistsError:
            return False

    return call_with_retry(create, f"create {path}")


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, default=str).encode()


def write_json_atomic(path: str, value: Any) -> None:
    write_atomic(path, json_bytes(value))


def delete(path: str, recursive: bool = False) -> None:
    fs, fs_path = filesystem(path)

    def remove() -> None:
        try:
            fs.rm(fs_path, recursive=recursive)
        except FileNotFoundError:
            pass

    call_with_retry(remove, f"delete {path}")


def list_names(path: str) -> list[str]:
    """Names (not paths) of the entries directly under `path`; empty if it does not exist."""
    return [entry["name"] for entry in list_details(path)]


def list_details(path: str) -> list[dict[str, Any]]:
    """The entries directly under `path` as the store describes them (size, type, and its change marks:
    `mtime`, `generation`, `ETag`...), each with `name` cut to its basename; empty if `path` does not exist."""
    fs, fs_path = filesystem(path)

    def listing() -> list[dict[str, Any]]:
        try:
            if _supports_refresh(fs):
                return fs.ls(fs_path, detail=True, refresh=True)
            return fs.ls(fs_path, detail=True)
        except FileNotFoundError:
            return []

    try:
        entries = call_with_retry(listing, f"list {path}")
    finally:
        forget_listings(path)
    return sorted(
        (
            {**entry, "name": posixpath.basename(entry["name"].rstrip("/"))}
            for entry in entries
            if entry["name"].rstrip("/") != fs_path.rstrip("/")
        ),
        key=lambda entry: entry["name"],
    )


def list_details_many(paths: Sequence[str]) -> list[list[dict[str, Any]]]:
    """`list_details` of each path: concurrently on an object store (a listing is a round trip there), one
    after another on a local disk."""
    if len(paths) <= 1 or not any(is_url(path) and not on_local_disk(path) for path in paths):
        return [list_details(path) for path in paths]
    with ThreadPoolExecutor(max_workers=min(IO_THREADS, len(paths))) as pool:
        return list(pool.map(list_details, paths))


def _supports_refresh(fs: fsspec.AbstractFileSystem) -> bool:
    return not isinstance(fs, (LocalFileSystem, MemoryFileSystem))


def forget_listings(path: str, everything: bool = False) -> None:
    """Drop the listings this thread's client cached at, above and below `path` (all of them if `everything`).

    fsspec keeps one client per thread, and s3fs / gcsfs answer `open`, `info` and `exists` from a cached
    listing of the parent folder when they hold one: a file another worker wrote after that listing is
    then "not found". So the executor's own listings leave nothing cached behind (a worker that polled a
    dependency's lease folder must still see the output written later), and each step starts with no
    cached listing at all (its thread may have listed anything, for an earlier step or while waiting).
    """
    fs, fs_path = filesystem(path)
    if not _supports_refresh(fs):
        return
    if everything:
        fs.invalidate_cache()
        return
    root = fs._strip_protocol(fs_path).rstrip("/")
    fs.invalidate_cache(root)  # the folder and its ancestors
    for key in [key for key in fs.dircache if key.startswith(root + "/")]:
        fs.dircache.pop(key, None)


def walk_files(path: str, skip: Callable[[str], bool] = lambda _name: False) -> list[tuple[str, int]]:
    """(relative path, size) of every file under `path`, skipping top-level names where `skip(name)`."""
    fs, fs_path = filesystem(path)
    root = fs_path.rstrip("/")

    def find() -> dict[str, Any]:
        try:
            forget_listings(path)
            return fs.find(root, detail=True)
        except FileNotFoundError:
            return {}

    try:
        found = call_with_retry(find, f"walk {path}")
    finally:
        forget_listings(path)  # find caches a listing of every folder it walked
    files = []
    for full, info in found.items():
        relative = full[len(root) :].lstrip("/")
        if not relative or skip(relative.split("/", 1)[0]) or info.get("type") == "directory":
            continue
        if info.get("islink"):  # a local symlink (wandb's latest-run) is not content; its target is listed
            continue
        files.append((relative, int(info.get("size") or 0)))
    return sorted(files)


def sha256_file(path: str) -> str:
    fs, fs_path = filesystem(path)

    def digest_file() -> str:
        digest = hashlib.sha256()
        with fs.open(fs_path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    return call_with_retry(digest_file, f"checksum {path}")


def move(source: str, destination: str) -> None:
    """Move a file within one store (rename locally; copy then delete on object stores)."""
    fs, source_path = filesystem(source)
    _, destination_path = filesystem(destination)
    if isinstance(fs, LocalFileSystem):
        os.makedirs(os.path.dirname(destination_path), exist_ok=True)
        os.replace(source_path, destination_path)
        return
    call_with_retry(lambda: fs.copy(source_path, destination_path), f"copy {source} -> {destination}")
    delete(source)


def move_tree(source: str, destination: str) -> None:
    """Move the folder `source` to `destination`, replacing what is there (one rename locally; every
    file copied then deleted on object stores)."""
    fs, source_path = filesystem(source)
    _, destination_path = filesystem(destination)
    if isinstance(fs, LocalFileSystem):
        if os.path.lexists(destination_path):  # left by a commit killed before its marker was written
            shutil.rmtree(destination_path)
        os.makedirs(os.path.dirname(destination_path), exist_ok=True)
        os.replace(source_path, destination_path)
        return
    delete(destination, recursive=True)
    for name, _size in walk_files(source):
        move(join(source, name), join(destination, name))


def upload_file(local_path: str, path: str) -> None:
    """Copy a local file to `path` atomically."""
    with open(local_path, "rb") as handle:
        write_atomic(path, handle.read())
