"""Levanter caches written shard by shard: one small cache per shard group, one ledger over them.

Levanter's trainer reads tokenized documents from a *cache*: a folder whose `shard_ledger.json`
says how many rows it holds, and whose `input_ids/{offsets,data}` zarr arrays (written by
tensorstore) hold the token ids of each document. A ledger with the "sharded" layout instead
lists sub-caches by relative path, and Levanter reads them in that order as one dataset; that is
what Marin's tokenize steps leave and what `consolidate_shard_cache_ledgers` writes.

So a shard group writes each split's documents as one sub-cache, in the layout Levanter's own
`SerialCacheWriter` leaves (same array specs, same ledger; `tests/steps/tokenize/test_levanter_cache.py` compares
them), into a folder of the shard's (`ShardWriter.folder`), which the executor commits with the
shard's marker: one rename on a local disk. Once every group is committed,
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

Before a run spends compute on a cache, `read_ledger` and `verify_cache` check it the cheap way: the ledger
is a JSON object, and each part it lists has its arrays, the row and token counts the ledger says (the
offsets array's row count and last end), and a readable shard index in every stored file (one element read
per file: zarr3 keeps a shard's index at its end, so a file cut short fails that read). A damaged cache is
reported by file, where Levanter would fail only when the damaged row is sampled, hours in.

A ledger names a tokenizer that is another step's output relative to the ledger's own folder (`ledger_metadata`,
`records.recorded_path`), so a cache is the same bytes under any prefix. Levanter's loader
compares a ledger's metadata with its own, which names the tokenizer by its absolute path, and warns on any
difference: that one difference, the same tokenizer folder named both ways (its `<name>-<hash>` folder and the
steps' path above it), is not logged (`SameTokenizerNamedRelatively`); any other is, as before.
"""

from __future__ import annotations

import ast
import functools
import ipaddress
import itertools
import json
import logging
import os
import posixpath
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorstore as ts
from levanter.store import jagged_array
from levanter.store.cache import CACHE_LAYOUT_SHARDED, CacheLedger, CacheMetadata, TreeCache
from tokenizers import Encoding

from executor import ShardWriter, recorded_path, storage

TOKENS_FIELD = "input_ids"
EXEMPLAR = {TOKENS_FIELD: np.zeros((0,), dtype=np.int32)}
"""The row shape of a text cache: one int32 array of token ids per document (Levanter's `BatchTokenizer`)."""
LEDGER_FILE = "shard_ledger.json"
SUPPORTED_SCHEMES = ("", "file", "gs", "gcs", "s3")


MISMATCH_WARNING = "Metadata mismatch: "
"""How Levanter's cache loader (levanter.store.cache) starts its warning, followed by the DeepDiff."""


def ledger_metadata(metadata: Mapping[str, Any], output_path: str, folder: str) -> dict[str, Any]:
    """`metadata` as the ledger in `folder` (under the step's `output_path`) records it: a tokenizer that is
    another step's output relative to `folder` (`records.recorded_path`)."""
    tokenizer = metadata.get("tokenizer")
    if not isinstance(tokenizer, str):
        return dict(metadata)
    return {**metadata, "tokenizer": recorded_path(tokenizer, output_path, folder)}


def same_tokenizer(recorded: Any, loaded: Any) -> bool:
    """Whether a ledger's relative tokenizer path (`ledger_metadata`) names the folder a loader gives by its
    absolute path: the path left after the `..` steps ends the loaded one (it holds the tokenizer step's
    content-hashed `<name>-<hash>` folder)."""
    if not isinstance(recorded, str) or not isinstance(loaded, str) or storage.is_url(recorded):
        return False
    if recorded.startswith("/"):
        return False
    parts = posixpath.normpath(recorded).split("/")
    tail = "/".join(itertools.dropwhile(lambda part: part == "..", parts))
    return bool(tail) and ".." not in tail.split("/") and loaded.rstrip("/").endswith("/" + tail)


class SameTokenizerNamedRelatively(logging.Filter):
    """Drops Levanter's metadata-mismatch warning when its only difference is one tokenizer named relatively (by
    the ledger) and absolutely (by the loader), the same folder (`same_tokenizer`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(MISMATCH_WARNING):
            return True
        try:
            diff = ast.literal_eval(message[len(MISMATCH_WARNING) :])
        except (ValueError, SyntaxError):
            return True
        changed = diff.get("values_changed") if isinstance(diff, dict) and set(diff) == {"values_changed"} else None
        if not isinstance(changed, dict) or len(changed) != 1:
            return True
        ((where, values),) = changed.items()
        return not (
            where.endswith("['tokenizer']")
            and isinstance(values, dict)
            and same_tokenizer(values.get("old_value"), values.get("new_value"))
        )


_levanter_cache_logger = logging.getLogger("levanter.store.cache")
if not any(isinstance(each, SameTokenizerNamedRelatively) for each in _levanter_cache_logger.filters):
    _levanter_cache_logger.addFilter(SameTokenizerNamedRelatively())


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

    Rows come as token id sequences (`write`), as `tokenizers` encodings (`write_encodings`) or as one array of
    ids (`write_ids`) and are framed
    with `prefix` and `suffix` (BOS, EOS). Each write turns its rows into one int32 array; the arrays are held
    until as many tokens are buffered as were written before (at least `first_flush_tokens`, one stored chunk,
    and at most `flush_tokens`), and then written in the background, in tensorstore's threads, while the group
    goes on encoding: up to the last multiple of `align_tokens` (a stored chunk of 262,144), the rest staying
    buffered, so that no chunk is compressed twice. Every write rewrites the array's one stored file (Levanter's
    spec puts 2^27 elements in a file), so writes that double what is written keep the rewritten bytes to about
    twice the file. The close writes the rest, and the offsets (row count and row ends) once, whole, beside it
    (see `_ArrayPair`). The two arrays are created in the background from the first row on too, so that closing
    a part compresses and writes only what came since the last write: a group's close sits between its last
    encoding and the next group's first (or the step's end), where cores idle. An empty group creates nothing
    and leaves no sub-cache."""

    def __init__(
        self,
        writer: ShardWriter,
        relative: str,
        metadata: dict[str, Any],
        prefix: Sequence[int] = (),
        suffix: Sequence[int] = (),
        flush_tokens: int = 1 << 24,
        first_flush_tokens: int = jagged_array.DEFAULT_CHUNK_SIZE,
        align_tokens: int = jagged_array.DEFAULT_CHUNK_SIZE,
    ):
        self._writer = writer
        self._relative = relative
        self._metadata = metadata
        self._prefix = list(prefix)
        self._suffix = list(suffix)
        self._flush_tokens = flush_tokens
        self._first_flush_tokens = first_flush_tokens
        self._align_tokens = align_tokens
        self._arrays: _ArrayPair | None = None
        self._opening: tuple[ts.Future, ts.Future] | None = None
        self._temp = ""
        self._buffer: list[np.ndarray] = []  # the tokens of each write since the last flush
        self._buffered = 0
        self._ends: list[np.ndarray] = []  # each write's row ends: offsets, written at close
        self.rows = 0
        self.tokens = 0

    def write(self, rows: Sequence[Sequence[int]]) -> None:
        """Append `rows`, each a sequence of token ids."""
        self._append(len(rows), (len(ids) for ids in rows), rows)

    def write_encodings(self, encodings: Sequence[Encoding]) -> None:
        """Append one row per `tokenizers` encoding (its ids). Each encoding's list of ids is made, copied into
        the array and freed in turn, never all of a batch's at once: about a sixth less time than `write` over
        their ids, the ids included (76 ms against 92 on bench_tokenize's 2.3M tokens; making the lists alone,
        as any caller of the tokenizer must, takes 38)."""
        self._append(len(encodings), (len(encoding) for encoding in encodings),
                     (encoding.ids for encoding in encodings))  # fmt: skip

    def _append(self, count: int, lengths: Iterable[int], rows: Iterable[Sequence[int]]) -> None:
        """Append `count` rows: `lengths` gives each one's number of ids, `rows` the ids, both in order."""
        if not count:
            return
        row_lengths = np.fromiter(lengths, dtype=np.int64, count=count) + len(self._prefix) + len(self._suffix)
        # One pass over every id, framed, into the array: a fifth less time than a slice assignment per row.
        framed = itertools.chain.from_iterable(self._framed(rows))
        try:
            tokens = np.fromiter(framed, dtype=np.int32, count=int(row_lengths.sum()))
            longer = next(framed, None) is not None
        except ValueError as error:  # numpy: "iterator too short"
            raise ValueError(f"{self._relative}: {count} rows hold fewer ids than their lengths say "
                             f"({error})") from error  # fmt: skip
        if longer:
            raise ValueError(f"{self._relative}: {count} rows hold more ids than their lengths say; an "
                             "encoding's len() must be its number of ids")  # fmt: skip
        self._buffer_rows(row_lengths, tokens)

    def write_ids(self, pieces: Sequence[np.ndarray]) -> None:
        """Append one row whose ids are the arrays `pieces` end to end (a long document's pieces), framed in one
        copy, without a Python int per id."""
        prefix, suffix = (np.asarray(framing, dtype=np.int32) for framing in (self._prefix, self._suffix))
        tokens = np.concatenate([prefix, *pieces, suffix], dtype=np.int32)
        self._buffer_rows(np.array([len(tokens)], dtype=np.int64), tokens)

    def _buffer_rows(self, row_lengths: np.ndarray, tokens: np.ndarray) -> None:
        """Hold rows of `row_lengths` framed ids, `tokens` end to end, writing them once enough are buffered."""
        if self._opening is None:
            self._temp = self._writer.folder(self._relative)
            self._opening = _ArrayPair.open(storage.join(self._temp, TOKENS_FIELD))
        self._ends.append(np.cumsum(row_lengths) + self.tokens)
        self._buffer.append(tokens)
        self._buffered += len(tokens)
        self.rows += len(row_lengths)
        self.tokens += len(tokens)
        written = self.tokens - self._buffered
        if self._buffered >= min(self._flush_tokens, max(self._first_flush_tokens, written)):
            self._flush(final=False)

    def _framed(self, rows: Iterable[Sequence[int]]) -> Iterator[Sequence[int]]:
        for ids in rows:
            yield self._prefix
            yield ids
            yield self._suffix

    def _flush(self, final: bool) -> None:
        """Start writing the buffered tokens, up to the last whole stored chunk unless `final`: the rest stays
        buffered, so that no chunk is compressed twice (rows may straddle a write: offsets come at close)."""
        if self._buffer:
            tokens = np.concatenate(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
            keep = 0 if final else self.tokens % self._align_tokens
            if keep < len(tokens):
                self._opened().append(tokens[: len(tokens) - keep])
                # a copy of the rest (under a chunk), so the written array is freed once its write ends
                self._buffer = [tokens[len(tokens) - keep :].copy()] if keep else []
                self._buffered = keep
        if final and self.rows:
            self._opened().finish(np.concatenate([[self.rows], *self._ends]))

    def _opened(self) -> _ArrayPair:
        if self._arrays is None:
            assert self._opening is not None  # _append started opening them with the rows it buffered
            self._arrays = _ArrayPair.opened(self._opening)
        return self._arrays

    def close(self) -> None:
        """Write what is buffered and the sub-cache's own ledger (what Levanter's `SerialCacheWriter` leaves);
        the shard commits the sub-cache's folder."""
        self._flush(final=True)
        if self._arrays is None:
            return
        ledger = CacheLedger(
            total_num_rows=self.rows,
            is_finished=True,
            shard_rows={"": self.rows},
            finished_shards=[""],
            field_counts={TOKENS_FIELD: self.tokens},
            metadata=CacheMetadata(ledger_metadata(self._metadata, self._writer.output_path,
                                                   storage.join(self._writer.output_path, self._relative))),
        )
        storage.write_atomic(storage.join(self._temp, LEDGER_FILE), ledger.to_json())


def close_parts(parts: Iterable[PartWriter]) -> None:
    """Close a shard group's parts (its train and validation sub-caches) at once: a close is tensorstore
    writes and file system calls, which release the GIL, so the parts' fixed costs (array files, ledger)
    overlap instead of adding up between the group's last encoding and the next group's first."""
    parts = list(parts)
    with ThreadPoolExecutor(max(1, len(parts)), thread_name_prefix="close") as closer:
        for closing in [closer.submit(part.close) for part in parts]:
            closing.result()


class _ArrayPair:
    """The two zarr3 arrays of one field of a Levanter cache (`JaggedArrayStore`'s layout): `data`, every
    row's tokens end to end; `offsets`, the row count at [0] and each row's end offset at [1 + row].

    Created with Levanter's own spec (`jagged_array._get_spec`: sharded chunks, blosc zstd), so Levanter
    opens them as if its `SerialCacheWriter` had written them (`tests/steps/tokenize/test_levanter_cache.py` compares
    the metadata and the file bytes). Written here rather than through `JaggedArrayStore.extend`, which writes
    the row count as a separate read-modify-write of the offsets after every batch, on arrays opened
    one after the other with tensorstore's default of an fsync per file write. Here `data` is written as tokens
    come and `offsets` once, whole, when the part finishes (its writer holds them until then: 8 bytes a row,
    0.8 MB for 10^5 documents), the row count in the same write: closing a part then waits for the last data
    and one offsets write side by side, not for a data write and then a read-modify-write of offsets[0]. Local
    files are made durable as the executor's own are, by the atomic commit (a rename) after a complete write,
    not by fsync."""

    def __init__(self, offsets: ts.TensorStore, data: ts.TensorStore):
        self._offsets = offsets
        self._data = data
        self._tokens = 0
        self._writing: list[ts.WriteFutures] = []
        self._sources: list[np.ndarray] = []  # what the writes in flight read from, alive until they end

    @staticmethod
    def open(path: str) -> tuple[ts.Future, ts.Future]:
        """Start creating the arrays under `path` (offsets, data); `opened` waits for them."""

        def open_array(name: str, dtype: str) -> ts.Future:
            spec = jagged_array._get_spec(storage.join(path, name), [0], write_codec=jagged_array.DEFAULT_BLOSC_CODEC)
            return ts.open(spec, create=True, dtype=dtype, shape=[2**54], context=_write_context())

        return open_array("offsets", "int64"), open_array("data", "int32")

    @staticmethod
    def opened(opening: tuple[ts.Future, ts.Future]) -> _ArrayPair:
        offsets, data = opening
        return _ArrayPair(offsets.result(), data.result())

    def append(self, tokens: np.ndarray) -> None:
        """Start appending `tokens` to `data`. The write runs in tensorstore's threads until `wait`; the previous
        one is waited for first, since two writes into one stored file must not interleave."""
        self.wait()
        self._writing = [self._data[self._tokens : self._tokens + len(tokens)].write(tokens)]
        self._sources = [tokens]
        self._tokens += len(tokens)

    def finish(self, offsets: np.ndarray) -> None:
        """Write `offsets` (the row count, then every row's end) beside the last data write; wait for both."""
        self._writing.append(self._offsets[: len(offsets)].write(offsets))
        self._sources.append(offsets)
        self.wait()

    def wait(self) -> None:
        """Wait for the writes in flight; a failed one raises here."""
        for write in self._writing:
            write.result()
        self._writing, self._sources = [], []


@functools.cache
def _write_context() -> ts.Context:
    """Tensorstore resources for writing: no cache, no fsync per write (see `_ArrayPair`)."""
    return ts.Context({"cache_pool": {}, "file_io_sync": False})


def write_sharded_ledger(
    split_path: str, parts: Sequence[PartFigures], metadata: dict[str, Any], output_path: str
) -> CacheLedger:
    """Write the ledger that makes the committed sub-caches `parts` (in order) one Levanter cache, a folder of the
    step output `output_path` (see `ledger_metadata`)."""
    parts = [part for part in parts if part.rows]  # an empty group wrote no sub-cache
    ledger = CacheLedger(
        total_num_rows=sum(part.rows for part in parts),
        shard_rows={part.name: part.rows for part in parts},
        is_finished=True,
        finished_shards=[part.name for part in parts],
        field_counts={TOKENS_FIELD: sum(part.tokens for part in parts)} if parts else {},
        field_counts_by_shard={part.name: {TOKENS_FIELD: part.tokens} for part in parts},
        layout=CACHE_LAYOUT_SHARDED,
        metadata=CacheMetadata(ledger_metadata(metadata, output_path, split_path)),
    )
    storage.write_atomic(storage.join(split_path, LEDGER_FILE), ledger.to_json())
    TreeCache.load(split_path, EXEMPLAR)  # Levanter's own checks of a sharded ledger
    return ledger


def load_cache(split_path: str) -> TreeCache:
    """A split written by the tokenize step, as Levanter's trainer opens it."""
    return TreeCache.load(split_path, EXEMPLAR)


class CacheCheckError(ValueError):
    """A cache whose ledger or arrays are damaged or disagree; the message names the file."""


def read_ledger(split_path: str) -> dict[str, Any] | None:
    """A split's ledger as a JSON object (None if there is none); CacheCheckError if it is not one."""
    path = storage.join(split_path, LEDGER_FILE)
    raw = storage.read_bytes(path)
    if raw is None:
        return None
    try:
        ledger = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:  # cut short or overwritten: JSONDecodeError is a ValueError
        raise CacheCheckError(f"{path} is not valid JSON ({error}); the ledger is damaged: rerun the tokenize "
                              "step that wrote it (--force_run)") from error  # fmt: skip
    if not isinstance(ledger, dict):
        raise CacheCheckError(f"{path} holds a JSON {type(ledger).__name__}, not a Levanter cache ledger object; "
                              "rerun the tokenize step that wrote it (--force_run)")  # fmt: skip
    return ledger


def verify_cache(split_path: str, ledger: Mapping[str, Any]) -> int:
    """Check each part the ledger lists against its arrays (see the module note); CacheCheckError names the file.
    Returns the cache's tokens."""
    ledger_path = storage.join(split_path, LEDGER_FILE)
    rerun = "rerun the tokenize step that wrote it (--force_run)"
    if ledger.get("is_finished") is not True:
        raise CacheCheckError(f"{ledger_path} says the cache is unfinished (is_finished: "
                              f"{json.dumps(ledger.get('is_finished'))}): its tokenize step stopped before the end; "
                              f"{rerun}")  # fmt: skip
    parts = _ledger_parts(split_path, ledger, ledger_path)
    listed = sum(rows for _path, rows, _tokens in parts)
    if ledger.get("total_num_rows") != listed:
        raise CacheCheckError(f"{ledger_path} says total_num_rows={ledger.get('total_num_rows')} but its parts "
                              f"hold {listed} rows; the ledger is damaged: {rerun}")  # fmt: skip
    for part_path, rows, tokens in parts:
        arrays = storage.join(part_path, TOKENS_FIELD)
        offsets = _open_for_check(storage.join(arrays, "offsets"), ledger_path)
        data = _open_for_check(storage.join(arrays, "data"), ledger_path)
        stored_rows, end = (int(value) for value in _read_elements(offsets, [0, rows], arrays))
        if stored_rows != rows or (rows and end != tokens):
            raise CacheCheckError(f"{arrays}/offsets holds {stored_rows} rows ending at token {end}, but {ledger_path} "
                                  f"says {rows} rows of {tokens} tokens; the part is damaged: rerun the tokenize "
                                  "step that wrote it (--force_run)")  # fmt: skip
        for array, length in ((offsets, rows + 1), (data, tokens)):
            stride = int((array.chunk_layout.write_chunk.shape or (1,))[0] or 1)  # elements per stored file
            _read_elements(array, [*range(stride - 1, length - 1, stride), length - 1] if length else [], arrays)
    return sum(tokens for _path, _rows, tokens in parts)


def _ledger_parts(split_path: str, ledger: Mapping[str, Any], ledger_path: str) -> list[tuple[str, int, int]]:
    """(folder, rows, tokens) of each part: the sub-caches of a sharded ledger, or the split itself."""
    try:
        if ledger.get("layout") != CACHE_LAYOUT_SHARDED:
            tokens = (ledger.get("field_counts") or {}).get(TOKENS_FIELD, 0)
            return [(split_path, int(ledger["total_num_rows"]), int(tokens))]
        counts = ledger["field_counts_by_shard"]
        return [(storage.join(split_path, name), int(ledger["shard_rows"][name]), int(counts[name][TOKENS_FIELD]))
                for name in ledger["finished_shards"]]  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CacheCheckError(f"{ledger_path} lacks or garbles {error} that a Levanter ledger holds; rerun the "
                              "tokenize step that wrote it (--force_run)") from error  # fmt: skip


def _open_for_check(path: str, ledger_path: str) -> ts.TensorStore:
    try:
        spec = jagged_array._get_spec(path, [0], write_codec=None)
        return ts.open(spec, read=True, context=ts.Context({"cache_pool": {}})).result()
    except ValueError as error:  # tensorstore reports every failed status as a ValueError
        raise CacheCheckError(f"{path}, listed in {ledger_path}, cannot be opened ({error}); rerun the tokenize "
                              "step that wrote it (--force_run)") from error  # fmt: skip


def _read_elements(array: ts.TensorStore, positions: Sequence[int], arrays: str) -> list[int]:
    try:
        return [int(array[position].read().result()) for position in positions]
    except ValueError as error:
        raise CacheCheckError(f"{arrays}: a stored file cannot be read ({error}); the part is damaged: rerun the "
                              "tokenize step that wrote it (--force_run)") from error  # fmt: skip
