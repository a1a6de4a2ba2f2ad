"""Fuzzy dedup: MinHash + LSH, connected components, keep the first document of each cluster.

Stages, each a set of shards committed with `run_sharded` under `work/` (so a restart redoes only
unfinished shards of the first unfinished stage), none of which needs all data on one node:

1. signatures (one shard per input file): MinHash each document (`steps/minhash.py`), fold each
   band into a 64-bit key and write, for every band and hash range, that partition's
   (key, document) pairs: `work/buckets/from-SSSSS/bBBB-hHHH.npz`.
2. buckets (one shard per band x hash range): sort the partition's pairs by key; documents that
   share a key are candidates, linked as a star from the bucket's smallest document. Edges are
   written both ways into node partitions (`steps/connected_components.py`).
3. components: large-star / small-star rounds over node partitions until every component is a
   star around its smallest document key, which is the first document in input order.
4. assign (one shard per node partition): (document, cluster root) pairs, grouped by input file.
5. filter (one shard per input file): keep a document unless its cluster root is another
   document; write the kept documents and `clusters/shard-SSSSS.parquet` (id, cluster_id, kept)
   for every clustered document, so anyone can see which document a dropped one matched.

datatrove runs stage 3 on a single CPU over all edges (their issue #106); here it is as parallel
as stage 2. A cluster id is "SSSSS:ROW" of its root document, which is the one kept.

Output: `docs/shard-*.parquet`, `clusters/shard-*.parquet`, `stats.json`, `work/` (intermediate).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from executor import storage
from executor.shards import Shard, ShardWriter, run_sharded
from steps.connected_components import (
    connected_components,
    load_arrays,
    read_partition,
    save_arrays,
    star_assignments,
    write_partitioned_edges,
)
from steps.documents import (
    ReadReport,
    doc_key,
    flow_stats,
    list_input_files,
    merge_stats,
    read_documents,
    shard_file,
    split_key,
    text_bytes,
    to_table,
    write_stats,
    write_table,
)
from steps.minhash import MinHasher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FuzzyDedupConfig:
    input_paths: list[str]
    """Document files, folders or globs (JSONL or Parquet), read in this order: earlier documents win."""
    output_path: str
    """Where docs/, clusters/, stats.json and work/ go (THIS_OUTPUT_PATH in a DAG)."""
    n_grams: int = 5
    """Words per shingle. Versioned."""
    bands: int = 16
    """LSH bands. With `rows` it sets the similarity threshold, about (1/bands)^(1/rows) = 0.63 here: a pair
    at Jaccard 0.8 becomes a candidate with probability 1 - (1 - 0.8^6)^16 = 0.99, at 0.5 with 0.22. Versioned."""
    rows: int = 6
    """MinHash values per band; bands * rows permutations in all. Versioned."""
    seed: int = 1
    """Seed of the permutations. Versioned."""
    hash_ranges: int = 2
    """Partitions of each band's key space for stage 2; more spreads wider. Layout only."""
    node_partitions: int = 4
    """Partitions of the document graph for stages 3 and 4. Layout only."""
    batch_docs: int = 2000
    """Documents MinHashed per numpy batch; memory only."""
    raw_input: bool = True
    """Whether an input file with no usable document is an error (False for our own outputs)."""

    def hasher(self) -> MinHasher:
        return MinHasher(n_grams=self.n_grams, bands=self.bands, rows=self.rows, seed=self.seed)


@dataclass(frozen=True)
class _FilePayload:
    config: FuzzyDedupConfig
    shard_index: int
    path: str


def _signature_shard(payload: _FilePayload, writer: ShardWriter) -> dict[str, int]:
    config, hasher = payload.config, payload.config.hasher()
    report = ReadReport()
    texts = [document["text"] for document in read_documents(payload.path, report, config.raw_input)]
    key_parts, band_parts = [], []
    for start in range(0, len(texts), config.batch_docs):
        signatures, has_signature = hasher.signatures(texts[start : start + config.batch_docs])
        rows = np.arange(start, start + len(has_signature))[has_signature]
        key_parts.append((np.int64(payload.shard_index) << np.int64(32)) | rows.astype(np.int64))
        band_parts.append(hasher.band_keys(signatures[has_signature]))
    keys = np.concatenate(key_parts) if key_parts else np.zeros(0, np.int64)
    bands = np.concatenate(band_parts) if band_parts else np.zeros((0, config.bands), np.uint64)
    ranges = (bands >> np.uint64(32)) % np.uint64(config.hash_ranges)
    for band in range(config.bands):
        for hash_range in range(config.hash_ranges):
            chosen = ranges[:, band] == hash_range
            save_arrays(writer, f"from-{payload.shard_index:05d}/b{band:03d}-h{hash_range:03d}.npz",
                        band_key=bands[chosen, band], doc=keys[chosen])  # fmt: skip
    stats = flow_stats(report, 0, 0)
    stats["docs_without_signature"] = int(len(texts) - len(keys))
    return stats


@dataclass(frozen=True)
class _BucketPayload:
    buckets_folder: str
    partition: str
    node_partitions: int


def _bucket_shard(payload: _BucketPayload, writer: ShardWriter) -> dict[str, int]:
    fs, fs_path = storage.filesystem(payload.buckets_folder)
    band_keys, docs = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
    for path in sorted(fs.glob(f"{fs_path}/from-*/{payload.partition}.npz")):
        arrays = load_arrays(fs.unstrip_protocol(path) if storage.is_url(payload.buckets_folder) else path)
        band_keys.append(arrays["band_key"])
        docs.append(arrays["doc"])
    band_key, doc = np.concatenate(band_keys), np.concatenate(docs)
    order = np.lexsort((doc, band_key))
    band_key, doc = band_key[order], doc[order]
    new_bucket = np.concatenate([[True], band_key[1:] != band_key[:-1]]) if len(doc) else np.zeros(0, bool)
    first = doc[np.maximum.accumulate(np.where(new_bucket, np.arange(len(doc)), 0))] if len(doc) else doc
    linked = first != doc
    write_partitioned_edges(writer, f"from-{payload.partition}", first[linked], doc[linked], payload.node_partitions)
    return {"rows": int(linked.sum()), "candidate_pairs": int(linked.sum())}


@dataclass(frozen=True)
class _AssignPayload:
    components_folder: str
    partition: int


def _assign_shard(payload: _AssignPayload, writer: ShardWriter) -> dict[str, int]:
    source, target = read_partition(payload.components_folder, payload.partition)
    nodes, roots = star_assignments(source, target)
    shards = nodes >> 32
    for shard_index in np.unique(shards):
        chosen = shards == shard_index
        save_arrays(writer, f"from-{payload.partition:04d}/shard-{int(shard_index):05d}.npz",
                    doc=nodes[chosen], root=roots[chosen])  # fmt: skip
    return {"rows": len(nodes), "clustered_docs": len(nodes), "dropped": int(np.sum(nodes != roots))}


def _cluster_id(key: int) -> str:
    shard_index, row = split_key(key)
    return f"{shard_index:05d}:{row}"


def _filter_shard(payload: _FilePayload, writer: ShardWriter) -> dict[str, object]:
    assign_folder = storage.join(payload.config.output_path, "work", "assign")
    fs, fs_path = storage.filesystem(assign_folder)
    roots: dict[int, int] = {}
    for path in sorted(fs.glob(f"{fs_path}/from-*/shard-{payload.shard_index:05d}.npz")):
        arrays = load_arrays(fs.unstrip_protocol(path) if storage.is_url(assign_folder) else path)
        roots.update(zip(arrays["doc"].tolist(), arrays["root"].tolist(), strict=True))
    report = ReadReport()
    kept, clustered = [], []
    for row, document in enumerate(read_documents(payload.path, report, payload.config.raw_input)):
        key = doc_key(payload.shard_index, row)
        root = roots.get(key)
        if root is not None:
            clustered.append({"id": document["id"], "cluster_id": _cluster_id(root), "kept": root == key})
        if root is None or root == key:
            kept.append(document)
    write_table(writer, shard_file(payload.shard_index), to_table(kept))
    cluster_schema = pa.schema([("id", pa.string()), ("cluster_id", pa.string()), ("kept", pa.bool_())])
    write_table(writer, f"clusters/shard-{payload.shard_index:05d}.parquet",
                pa.Table.from_pylist(clustered, schema=cluster_schema))  # fmt: skip
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = {"fuzzy_duplicate": report.docs - len(kept)}
    return stats


def fuzzy_dedup(config: FuzzyDedupConfig) -> None:
    files = list_input_files(config.input_paths)
    work = storage.join(config.output_path, "work")
    file_shards = [Shard(f"{index:05d}", _FilePayload(config, index, path)) for index, path in enumerate(files)]
    buckets_folder = storage.join(work, "buckets")
    signature_report = run_sharded(buckets_folder, file_shards, _signature_shard, description="minhash signatures")
    partitions = [f"b{band:03d}-h{hash_range:03d}" for band in range(config.bands)
                  for hash_range in range(config.hash_ranges)]  # fmt: skip
    edges_folder = storage.join(work, "edges")
    bucket_shards = [Shard(name, _BucketPayload(buckets_folder, name, config.node_partitions)) for name in partitions]
    edge_report = run_sharded(edges_folder, bucket_shards, _bucket_shard, description="lsh buckets")
    converged = connected_components(storage.join(work, "components"), edges_folder, config.node_partitions)
    assign_shards = [Shard(f"{p:04d}", _AssignPayload(converged, p)) for p in range(config.node_partitions)]
    run_sharded(storage.join(work, "assign"), assign_shards, _assign_shard, description="cluster assignment")
    filter_report = run_sharded(config.output_path, file_shards, _filter_shard, description="fuzzy filter")
    stats = merge_stats(filter_report)
    stats["candidate_pairs"] = sum(m["stats"]["candidate_pairs"] for m in edge_report.markers.values())
    stats["docs_without_signature"] = sum(
        marker["stats"]["docs_without_signature"] for marker in signature_report.markers.values()
    )
    stats["settings"] = {"n_grams": config.n_grams, "bands": config.bands, "rows": config.rows}
    write_stats(config.output_path, stats)
