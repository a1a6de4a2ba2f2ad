"""Levanter caches written shard by shard: one small cache per shard group, one ledger over them.

Levanter's trainer reads tokenized documents from a *cache*: a folder whose `shard_ledger.json`
says how many rows it holds, and whose `input_ids/{offsets,data}` zarr arrays (written by
tensorstore) hold the token ids of each document. A ledger with the "sharded" layout instead
lists sub-caches by relative path, and Levanter reads them in that order as one dataset; that is
what Marin's tokenize steps leave and what `consolidate_shard_cache_ledgers` writes.

So a shard group writes its documents with Levanter's own `SerialCacheWriter` into the shard's
temp folder (`ShardWriter.temp_root`), registers every file it produced with the `ShardWriter`,
and the executor commits them atomically with the shard's marker. Once every group is committed,
`write_sharded_ledger` writes the split's ledger from the markers' row and token counts, in one
atomic write: no group is opened again, where `consolidate_shard_cache_ledgers` would start a
worker pool to probe every sub-cache (10^5 of them at full scale) for figures we already hold.
The ledger is Levanter's `CacheLedger`, checked by loading it with Levanter's `TreeCache`.

Tensorstore writes the arrays, so the output must be a local path, `gs://` or `s3://`;
fsspec's `memory://` has no tensorstore driver and is refused up front. Tensorstore has its own HTTP
clients, configured by environment. On S3, Levanter's spec takes the endpoint from `AWS_ENDPOINT_URL`
and addresses buckets virtual-hosted style (`http://<bucket>.<endpoint host>`), so an endpoint given by
IP address names a host no resolver knows (tensorstore kept retrying it for 5 minutes here): that is
refused up front too (`localhost` works: curl resolves `*.localhost` to loopback). On GCS,
`TENSORSTORE_GCS_HTTP_URL` points tensorstore at another server.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from levanter.store.cache import CACHE_LAYOUT_SHARDED, CacheLedger, CacheMetadata, SerialCacheWriter, TreeCache

from executor import storage
from executor.shards import ShardWriter

TOKENS_FIELD = "input_ids"
EXEMPLAR = {TOKENS_FIELD: np.zeros((0,), dtype=np.int32)}
"""The row shape of a text cache: one int32 array of token ids per document (Levanter's `BatchTokenizer`)."""
LEDGER_FILE = "shard_ledger.json"
SUPPORTED_SCHEMES = ("", "file", "gs", "gcs", "s3")


class UnsupportedCachePathError(ValueError):
    """A cache path that tensorstore cannot write (e.g. fsspec's memory://)."""


def check_cache_path(path: str, step: str) -> None:
    """Refuse a path tensorstore cannot write, naming the step and what to use instead."""
    scheme = path.split("://", 1)[0] if "://" in path else ""
    if scheme not in SUPPORTED_SCHEMES:
        raise UnsupportedCachePathError(
            f"{step}: cannot write a Levanter cache at {path}: its arrays are written by tensorstore, "
            f"which supports local paths, gs:// and s3://, not {scheme}://; run the step under such a prefix"
        )
    if scheme == "s3":
        _check_s3_endpoint(path, step)


def _check_s3_endpoint(path: str, step: str) -> None:
    # The variable Levanter's `build_kvstore_spec` reads when it builds the tensorstore spec.
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    host = urllib.parse.urlparse(endpoint).hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return  # unset, or a host name: tensorstore can address the bucket under it
    raise UnsupportedCachePathError(
        f"{step}: cannot write a Levanter cache at {path} through AWS_ENDPOINT_URL={endpoint}: tensorstore "
        f"addresses the bucket as <bucket>.{host}, which no resolver knows for an IP address; give the "
        "endpoint by host name (for a server on this machine, localhost)"
    )


@dataclass(frozen=True)
class PartFigures:
    """What one shard group wrote into one split: its sub-cache's folder name (relative to the split), rows
    and tokens (read back from the shard's marker)."""

    name: str
    rows: int
    tokens: int


class PartWriter:
    """Streams one shard group's documents of one split into a Levanter cache at `relative` under the
    step's output, through the shard's temp folder, so that it is committed with the shard.
    Nothing is written until the first document: an empty group leaves no sub-cache."""

    def __init__(self, writer: ShardWriter, relative: str, metadata: dict[str, Any]):
        self._writer = writer
        self._relative = relative
        self._metadata = metadata
        self._cache: SerialCacheWriter | None = None
        self._open = contextlib.ExitStack()
        self.rows = 0
        self.tokens = 0

    def write(self, documents: Sequence[np.ndarray]) -> None:
        if not documents:
            return
        if self._cache is None:
            temp = storage.join(self._writer.temp_root, self._relative)
            writer = SerialCacheWriter(temp, EXEMPLAR, metadata=CacheMetadata(self._metadata))
            self._cache = self._open.enter_context(writer)
        self._cache.write_batch({TOKENS_FIELD: list(documents)})
        self.rows += len(documents)
        self.tokens += sum(len(ids) for ids in documents)

    def close(self) -> None:
        """Write the sub-cache's own ledger and register its files with the shard (moved and checksummed
        at commit)."""
        if self._cache is None:
            return
        self._open.close()  # SerialCacheWriter writes the sub-cache's ledger on a clean exit
        temp = storage.join(self._writer.temp_root, self._relative)
        for name, _size in storage.walk_files(temp):
            self._writer.path(f"{self._relative}/{name}")


def write_sharded_ledger(split_path: str, parts: Sequence[PartFigures], metadata: dict[str, Any]) -> CacheLedger:
    """Write the ledger that makes the committed sub-caches `parts` (in order) one Levanter cache."""
    parts = [part for part in parts if part.rows]  # an empty group wrote no sub-cache
    ledger = CacheLedger(
        total_num_rows=sum(part.rows for part in parts),
        shard_rows={part.name: part.rows for part in parts},
        is_finished=True,
        finished_shards=[part.name for part in parts],
        field_counts={TOKENS_FIELD: sum(part.tokens for part in parts)} if parts else {},
        field_counts_by_shard={part.name: {TOKENS_FIELD: part.tokens} for part in parts},
        layout=CACHE_LAYOUT_SHARDED,
        metadata=CacheMetadata(metadata),
    )
    storage.write_atomic(storage.join(split_path, LEDGER_FILE), ledger.to_json())
    TreeCache.load(split_path, EXEMPLAR)  # Levanter's own checks of a sharded ledger
    return ledger


def load_cache(split_path: str) -> TreeCache:
    """A split written by the tokenize step, as Levanter's trainer opens it."""
    return TreeCache.load(split_path, EXEMPLAR)
