"""Download files from http(s)://, hf://, gs://, s3:// or a local path into a step's output.

Files under `source` are listed (fsspec's `find`; for http(s) its HTML index parser, or the
explicit `files` list), filtered by `include` globs on their path relative to `source`, and
transferred in parallel, one shard per file (committed with `run_sharded`, so a rerun fetches only
files not yet committed).

Resume: bytes land in a partial file first (`<output>/.download_partial/` for a local output,
else a local temp folder). A transfer that breaks raises `TransientError`; the shard is retried
and continues from the partial file's size (an HTTP `Range` request, or a `seek` on any fsspec
file), so a 10 GB file interrupted at 9 GB fetches 1 GB more.

Checksums: every file's sha256 and size go into `manifest.json`, next to the checksum the source
publishes where it does — GCS `md5Hash`, S3 `ETag` (single-part uploads are MD5), the Hub's LFS
`sha256`, or a `SHA256SUMS` file in the source folder — and a mismatch fails the shard.

Columns: a source whose Parquet files name their text or id column otherwise (`text_column`, `id_column`)
has them renamed to `text` and `id` once its bytes are verified (`steps/data/source_schema.py`); the
manifest then holds the stored file's sha256 and `source_sha256`, the one the source published.

Output: `files/<relative path>`, `manifest.json`, `stats.json`. A source that is another step's output of the
DAG is named relative to the output (`records.recorded_path`), so the same DAG under another prefix writes the
same bytes.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import http.client
import logging
import os
import re
import socket
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from executor import Shard, ShardWriter, TransientError, recorded_path, run_sharded, storage
from steps.data.source_schema import normalize_parquet

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
PARTIAL_DIR = ".download_partial"


class ChecksumMismatchError(ValueError):
    """The downloaded bytes do not match the checksum the source publishes."""


@dataclass(frozen=True)
class DownloadConfig:
    source: str
    """A URL or path: a folder (listed) or one file. Versioned."""
    output_path: str
    """Where files/, manifest.json and stats.json go (THIS_OUTPUT_PATH in a DAG)."""
    include: list[str] = field(default_factory=lambda: ["*"])
    """Globs on paths relative to `source`; a file is fetched if any matches. Versioned."""
    files: list[str] | None = None
    """Relative paths to fetch instead of listing (for servers without an index page). Versioned."""
    checksums_file: str | None = "SHA256SUMS"
    """A `sha256  name` list in the source folder to verify against, used if present."""
    parallel: int = 8
    """Files transferred at once (threads). Performance only."""
    timeout_s: float = 60.0
    """Socket timeout of one HTTP request."""
    text_column: str = "text"
    """The column of the source's Parquet files that holds the text; another name is renamed to `text` at
    download (`steps/data/source_schema.py`). Versioned."""
    id_column: str | None = "id"
    """The column with a document id, renamed to `id`; None numbers each file's rows. Versioned."""


@dataclass(frozen=True)
class _Transfer:
    url: str
    relative: str
    size: int | None
    published: dict[str, str]
    """Checksums the source publishes: {"md5": hex} or {"sha256": hex}."""
    partial_path: str
    timeout_s: float
    columns: tuple[str, str | None] = ("text", "id")
    """(text column, id column) of the source; other than ("text", "id"), Parquet files are normalized."""


def _is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def list_source(config: DownloadConfig) -> list[tuple[str, str, dict[str, Any]]]:
    """(url, relative path, fsspec info) of every file to fetch, sorted by relative path."""
    fs, root = storage.filesystem(config.source)
    root = root.rstrip("/")
    if config.files is not None:
        names = [(f"{root}/{relative}", relative) for relative in config.files]
    elif not _is_http(config.source) and fs.isfile(root):
        names = [(root, root.rsplit("/", 1)[-1])]
    else:
        if not fs.exists(root):
            raise FileNotFoundError(f"download source {config.source} does not exist")
        names = [(name, name[len(root) :].lstrip("/")) for name in sorted(fs.find(root))]
        names = [(name, rel) for name, rel in names if _is_http(config.source) or rel]
    chosen = []
    for name, relative in names:
        if relative and any(fnmatch.fnmatch(relative, pattern) for pattern in config.include):
            info = {} if _is_http(config.source) else fs.info(name)
            url = name if _is_http(config.source) else fs.unstrip_protocol(name)
            chosen.append((url if storage.is_url(config.source) else name, relative, info))
    if not chosen:
        raise FileNotFoundError(f"nothing under {config.source} matches {config.include}")
    return sorted(chosen, key=lambda item: item[1])


def published_checksums(info: dict[str, Any]) -> dict[str, str]:
    """What the store itself says the bytes hash to, in hex."""
    if isinstance(info.get("lfs"), dict) and info["lfs"].get("sha256"):
        return {"sha256": info["lfs"]["sha256"]}
    if info.get("md5Hash"):
        return {"md5": base64.b64decode(info["md5Hash"]).hex()}
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    if re.fullmatch(r"[0-9a-f]{32}", etag) and info.get("type") != "directory":
        return {"md5": etag}
    return {}


def _sums_file(config: DownloadConfig) -> dict[str, str]:
    """{relative path: sha256} from the source's checksums file, if it has one."""
    if not config.checksums_file:
        return {}
    try:
        data = storage.read_text(storage.join(config.source, config.checksums_file))
    except (OSError, ValueError, urllib.error.URLError):
        return {}
    sums = {}
    for line in (data or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


def _fetch_http(transfer: _Transfer, offset: int) -> None:
    request = urllib.request.Request(transfer.url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        with urllib.request.urlopen(request, timeout=transfer.timeout_s) as response:
            mode = "ab" if offset and response.status == 206 else "wb"
            expected = _expected_total(response, offset if mode == "ab" else 0)
            with open(transfer.partial_path, mode) as handle:
                while chunk := response.read(CHUNK_BYTES):
                    handle.write(chunk)
    except urllib.error.HTTPError as error:
        if error.code in (408, 425, 429, 500, 502, 503, 504):
            raise TransientError(f"{transfer.url}: HTTP {error.code}") from error
        raise FileNotFoundError(f"{transfer.url}: HTTP {error.code} {error.reason}") from error
    except (OSError, urllib.error.URLError, http.client.HTTPException) as error:
        raise TransientError(f"{transfer.url}: {_why_it_broke(error, transfer)}") from error
    if expected is not None and _size(transfer.partial_path) != expected:
        raise TransientError(f"{transfer.url}: got {_size(transfer.partial_path)} of {expected} bytes")


def _why_it_broke(error: BaseException, transfer: _Transfer) -> str:
    """What a failed HTTP transfer says: the cause a user can act on where the socket gives one."""
    reason = getattr(error, "reason", error)
    where = urllib.parse.urlsplit(transfer.url).netloc
    if isinstance(reason, ConnectionRefusedError):
        return f"connection refused: nothing listens at {where}; check the source URL, or start its server"
    if isinstance(reason, socket.gaierror):
        return f"the host of {where} is not found ({reason.strerror}); check the source URL or this machine's network"
    if isinstance(reason, TimeoutError):
        return f"no answer from {where} within timeout_s={transfer.timeout_s:g} s"
    return f"transfer broke after {_size(transfer.partial_path)} bytes ({type(reason).__name__}: {reason})"


def _expected_total(response: Any, offset: int) -> int | None:
    """The full file's size, from Content-Range (a resumed 206) or Content-Length."""
    content_range = response.headers.get("Content-Range", "")
    if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.isdigit() else None


def _fetch_fsspec(transfer: _Transfer, offset: int) -> None:
    fs, path = storage.filesystem(transfer.url)
    try:
        with fs.open(path, "rb") as source, open(transfer.partial_path, "ab" if offset else "wb") as handle:
            source.seek(offset)
            while chunk := source.read(CHUNK_BYTES):
                handle.write(chunk)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise TransientError(f"{transfer.url}: transfer broke after {_size(transfer.partial_path)} bytes") from error


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def _digests(path: str) -> dict[str, str]:
    sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            sha256.update(chunk)
            md5.update(chunk)
    return {"sha256": sha256.hexdigest(), "md5": md5.hexdigest()}


def _download_shard(transfer: _Transfer, writer: ShardWriter) -> dict[str, Any]:
    os.makedirs(os.path.dirname(transfer.partial_path), exist_ok=True)
    offset = _size(transfer.partial_path)
    if transfer.size is not None and offset > transfer.size:
        offset = 0
    if transfer.size is None or offset < transfer.size:
        if offset:
            logger.info("%s: resuming at byte %d", transfer.url, offset)
        (_fetch_http if _is_http(transfer.url) else _fetch_fsspec)(transfer, offset)
    size = _size(transfer.partial_path)
    if transfer.size is not None and size != transfer.size:
        raise TransientError(f"{transfer.url}: got {size} bytes, expected {transfer.size}")
    digests = _digests(transfer.partial_path)
    for algorithm, expected in transfer.published.items():
        if digests[algorithm] != expected.lower():
            os.remove(transfer.partial_path)
            raise ChecksumMismatchError(f"{transfer.url}: {algorithm} {digests[algorithm]} != published {expected}")
    source_sha256 = digests["sha256"]
    if transfer.columns != ("text", "id") and transfer.relative.endswith(".parquet"):
        normalize_parquet(transfer.partial_path, transfer.relative, *transfer.columns)
        size, digests = _size(transfer.partial_path), _digests(transfer.partial_path)
    storage.upload_file(transfer.partial_path, writer.path(f"files/{transfer.relative}"))
    os.remove(transfer.partial_path)
    return {"rows": 1, "url": transfer.url, "path": f"files/{transfer.relative}", "size": size,
            "sha256": digests["sha256"], "source_sha256": source_sha256, "resumed_from": offset,
            "published": transfer.published, "verified": sorted(transfer.published)}  # fmt: skip


def _shard_id(relative: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9_.\-]", "_", relative)[-60:].lstrip("._-") or "file"
    return f"{readable}-{hashlib.sha1(relative.encode()).hexdigest()[:8]}"


def _partial_root(output_path: str) -> str:
    if not storage.is_url(output_path) or output_path.startswith("file://"):
        return os.path.join(output_path.removeprefix("file://"), PARTIAL_DIR)
    digest = hashlib.sha1(output_path.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), "executor-download", digest)


def download(config: DownloadConfig) -> None:
    listed = list_source(config)
    sums = _sums_file(config)
    partial_root = _partial_root(config.output_path)
    shards = []
    for url, relative, info in listed:
        published = published_checksums(info)
        if relative in sums:
            published = {**published, "sha256": sums[relative]}
        size = info.get("size") if isinstance(info.get("size"), int) else None
        transfer = _Transfer(url, relative, size, published, os.path.join(partial_root, relative), config.timeout_s,
                             (config.text_column, config.id_column))  # fmt: skip
        shards.append(Shard(_shard_id(relative), transfer))
    report = run_sharded(config.output_path, shards, _download_shard, parallelism="thread",
                         max_workers=config.parallel, description=f"download {config.source}")  # fmt: skip
    files = [report.markers[shard.shard_id]["stats"] for shard in shards]
    manifest = [{key: entry[key] for key in ("path", "size", "sha256", "published", "verified")}
                | {"url": recorded_path(entry["url"], config.output_path)}
                | ({"source_sha256": entry["source_sha256"]} if entry.get("source_sha256", entry["sha256"])
                   != entry["sha256"] else {})
                for entry in files]  # fmt: skip
    storage.write_json_atomic(storage.join(config.output_path, "manifest.json"), manifest)
    stats = {"source": recorded_path(config.source, config.output_path), "files": len(files),
             "bytes": sum(entry["size"] for entry in files),
             "files_verified_against_source": sum(1 for entry in files if entry["verified"]),
             "files_resumed": sum(1 for entry in files if entry["resumed_from"]),
             "files_this_run": report.ran}  # fmt: skip
    storage.write_json_atomic(storage.join(config.output_path, "stats.json"), stats)
    logger.info("downloaded %d file(s), %d bytes from %s", stats["files"], stats["bytes"], config.source)
