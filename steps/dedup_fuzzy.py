"""Fuzzy dedup: MinHash + LSH, verified candidate pairs, connected components, keep the first of each cluster.

Stages, each a set of shards committed with `run_sharded` under `work/` (so a restart redoes only
unfinished shards of the first unfinished stage), none of which needs all data on one node:

1. signatures (one shard per input file S): MinHash each document (`steps/minhash.py`) and write
   its signatures, `work/minhash/signatures/shard-S.npz`; fold each band into a 64-bit key and
   write, for every band and hash range, that partition's (key, document) pairs:
   `work/minhash/buckets/from-S/bBBB-hHHH.npz`.
2. buckets (one shard per band x hash range): sort the partition's pairs by key; documents that
   share a key are candidate pairs (all pairs of a small bucket, a star from the first document
   of a large one). Each pair goes to the input shard of its first document:
   `work/candidates/from-bBBB-hHHH/to-S.npz`.
3. verify, first side (one shard per input file S): the distinct pairs whose first document is in
   S get that document's signature attached and move on to the second document's shard T.
4. verify, second side (one shard per input file T): each pair's Jaccard similarity is estimated
   as the fraction of equal MinHash values, and pairs below `jaccard_threshold` are dropped. LSH
   alone links every pair that agrees on one band, which at 16 x 6 includes pairs at Jaccard
   0.4 a few percent of the time: on a few thousand stdlib files, the `encodings/cp*.py` codec
   tables (true Jaccard 0.36-0.48) collided this way and took precision down to 0.76-0.88.
   The surviving edges are written both ways into node partitions
   (`steps/connected_components.py`). A pair joins stages 3 and 4 like a distributed hash join:
   no shard reads more signatures than those of its own input file.
5. components: large-star / small-star rounds over node partitions until every component is a
   star around its smallest document key, which is the first document in input order.
6. assign (one shard per node partition): (document, cluster root) pairs, grouped by input file.
7. filter (one shard per input file): keep a document unless its cluster root is another
   document; write the kept documents and `clusters/shard-SSSSS.parquet` (id, cluster_id, kept)
   for every clustered document, so anyone can see which document a dropped one matched.

datatrove runs stage 5 on a single CPU over all edges (their issue #106); here it is as parallel
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
    FileShard,
    ReadReport,
    doc_key,
    file_shards,
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
    jaccard_threshold: float = 0.65
    """Candidate pairs whose estimated Jaccard (share of equal MinHash values) is below this are not
    linked. With bands * rows = 96 values the estimate's standard deviation is sqrt(J(1 - J) / 96),
    about 0.04-0.05: a pair at J = 0.78 passes 0.65 with probability 0.999 (3 sigma) and one at 0.5
    with 0.002 (and becomes an LSH candidate at all with 0.22). At 0.7, 3% of pairs at 0.78 fail
    (2 of 30 planted copies did). Lower it, with the LSH threshold, to catch looser copies; 0 keeps
    every LSH candidate. Versioned."""
    all_pairs_bucket_size: int = 32
    """Buckets of up to this many documents propose every pair in them for verification; larger ones
    only each document with the bucket's first (a star), to bound the pairs. A star alone loses a copy
    whose bucket's first document is some third, dissimilar one that verification rejects. Versioned."""
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


def _signature_shard(payload: FileShard[FuzzyDedupConfig], writer: ShardWriter) -> dict[str, int]:
    config, hasher = payload.config, payload.config.hasher()
    report = ReadReport()
    texts = [document["text"] for document in read_documents(payload.path, report, config.raw_input)]
    key_parts, band_parts, signature_parts = [], [], []
    for start in range(0, len(texts), config.batch_docs):
        signatures, has_signature = hasher.signatures(texts[start : start + config.batch_docs])
        rows = np.arange(start, start + len(has_signature))[has_signature]
        key_parts.append((np.int64(payload.shard_index) << np.int64(32)) | rows.astype(np.int64))
        band_parts.append(hasher.band_keys(signatures[has_signature]))
        signature_parts.append(signatures[has_signature])
    keys = np.concatenate(key_parts) if key_parts else np.zeros(0, np.int64)
    bands = np.concatenate(band_parts) if band_parts else np.zeros((0, config.bands), np.uint64)
    permutations = config.bands * config.rows
    all_signatures = np.concatenate(signature_parts) if signature_parts else np.zeros((0, permutations), np.uint32)
    save_arrays(writer, f"signatures/shard-{payload.shard_index:05d}.npz", doc=keys, signature=all_signatures)
    ranges = (bands >> np.uint64(32)) % np.uint64(config.hash_ranges)
    for band in range(config.bands):
        for hash_range in range(config.hash_ranges):
            chosen = ranges[:, band] == hash_range
            save_arrays(writer, f"buckets/from-{payload.shard_index:05d}/b{band:03d}-h{hash_range:03d}.npz",
                        band_key=bands[chosen, band], doc=keys[chosen])  # fmt: skip
    stats = flow_stats(report, 0, 0)
    stats["docs_without_signature"] = int(len(texts) - len(keys))
    return stats


@dataclass(frozen=True)
class _BucketPayload:
    buckets_folder: str
    partition: str
    all_pairs_up_to: int


def _bucket_shard(payload: _BucketPayload, writer: ShardWriter) -> dict[str, int]:
    band_keys, docs = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
    for arrays in _load_matching(payload.buckets_folder, f"from-*/{payload.partition}.npz"):
        band_keys.append(arrays["band_key"])
        docs.append(arrays["doc"])
    band_key, doc = np.concatenate(band_keys), np.concatenate(docs)
    order = np.lexsort((doc, band_key))
    earlier, later = bucket_pairs(band_key[order], doc[order], payload.all_pairs_up_to)
    _save_by_shard(writer, f"from-{payload.partition}", earlier, earlier, later)
    return {"rows": len(earlier)}


def bucket_pairs(band_key: np.ndarray, doc: np.ndarray, all_pairs_up_to: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs (earlier, later document) from (band key, document) sorted by both: every pair
    in a bucket of at most `all_pairs_up_to` documents, and in a larger one each document with the first."""
    if not len(doc):
        return doc, doc
    index = np.arange(len(doc))
    new_bucket = np.concatenate([[True], band_key[1:] != band_key[:-1]])
    start = np.maximum.accumulate(np.where(new_bucket, index, 0))
    size = np.diff(np.append(np.flatnonzero(new_bucket), len(doc)))[np.cumsum(new_bucket) - 1]
    rank = index - start
    partners = np.where(size <= all_pairs_up_to, rank, np.minimum(rank, 1))
    later = np.repeat(index, partners)
    earlier = np.repeat(start, partners) + np.arange(len(later)) - np.repeat(np.cumsum(partners) - partners, partners)
    return doc[earlier], doc[later]


def _load_matching(folder: str, pattern: str) -> list[dict[str, np.ndarray]]:
    """The arrays of every file under `folder` matching `pattern`, in name order."""
    fs, fs_path = storage.filesystem(folder)
    paths = sorted(fs.glob(f"{fs_path}/{pattern}"))
    return [load_arrays(fs.unstrip_protocol(path) if storage.is_url(folder) else path) for path in paths]


def _save_by_shard(writer: ShardWriter, folder: str, route_by: np.ndarray, first: np.ndarray, second: np.ndarray,
                   **columns: np.ndarray) -> None:  # fmt: skip
    """Write pairs to `folder/to-SSSSS.npz`, S being the input shard of `route_by` (empty files are not written)."""
    shards = route_by >> np.int64(32)
    for shard_index in np.unique(shards):
        chosen = shards == shard_index
        save_arrays(writer, f"{folder}/to-{int(shard_index):05d}.npz", first=first[chosen], second=second[chosen],
                    **{name: values[chosen] for name, values in columns.items()})  # fmt: skip


@dataclass(frozen=True)
class _VerifyPayload:
    config: FuzzyDedupConfig
    shard_index: int
    pairs_folder: str
    """Where the pairs routed to this shard are (`*/to-SSSSS.npz`)."""


def _signatures_of(config: FuzzyDedupConfig, shard_index: int, keys: np.ndarray) -> np.ndarray:
    """The MinHash signatures of `keys`, documents of input shard `shard_index`."""
    path = storage.join(config.output_path, "work", "minhash", "signatures", f"shard-{shard_index:05d}.npz")
    stored = load_arrays(path)
    rows = np.searchsorted(stored["doc"], keys)
    if len(keys) and not np.array_equal(stored["doc"][np.minimum(rows, len(stored["doc"]) - 1)], keys):
        raise ValueError(f"{path} lacks signatures of some candidate documents; delete {config.output_path}/work "
                         "and rerun the step")  # fmt: skip
    return stored["signature"][rows]


def _verify_first_shard(payload: _VerifyPayload, writer: ShardWriter) -> dict[str, int]:
    """Distinct pairs whose first document is in this shard, with its signature, routed to the second's shard."""
    loaded = _load_matching(payload.pairs_folder, f"*/to-{payload.shard_index:05d}.npz")
    first = np.concatenate([np.zeros(0, np.int64)] + [arrays["first"] for arrays in loaded])
    second = np.concatenate([np.zeros(0, np.int64)] + [arrays["second"] for arrays in loaded])
    pairs = np.unique(np.stack([first, second], axis=1), axis=0) if len(first) else np.zeros((0, 2), np.int64)
    signature = _signatures_of(payload.config, payload.shard_index, pairs[:, 0])
    _save_by_shard(writer, f"from-{payload.shard_index:05d}", pairs[:, 1], pairs[:, 0], pairs[:, 1],
                   first_signature=signature)  # fmt: skip
    return {"rows": len(pairs), "candidate_pairs": len(pairs)}


def _verify_second_shard(payload: _VerifyPayload, writer: ShardWriter) -> dict[str, int]:
    """Keep the pairs whose second document is in this shard and whose MinHash similarity is high enough."""
    config = payload.config
    loaded = _load_matching(payload.pairs_folder, f"*/to-{payload.shard_index:05d}.npz")
    first = np.concatenate([np.zeros(0, np.int64)] + [arrays["first"] for arrays in loaded])
    second = np.concatenate([np.zeros(0, np.int64)] + [arrays["second"] for arrays in loaded])
    first_signature = np.concatenate([np.zeros((0, config.bands * config.rows), np.uint32)]
                                     + [arrays["first_signature"] for arrays in loaded])  # fmt: skip
    similarity = np.mean(first_signature == _signatures_of(config, payload.shard_index, second), axis=1)
    kept = similarity >= config.jaccard_threshold
    write_partitioned_edges(writer, f"from-{payload.shard_index:05d}", first[kept], second[kept],
                            config.node_partitions)  # fmt: skip
    return {"rows": int(kept.sum()), "verified_pairs": int(kept.sum()), "rejected_pairs": int((~kept).sum())}


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


def _filter_shard(payload: FileShard[FuzzyDedupConfig], writer: ShardWriter) -> dict[str, object]:
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


def _verify(config: FuzzyDedupConfig, files: int, candidates_folder: str) -> tuple[str, dict[str, int]]:
    """Stages 3 and 4; returns the folder of verified edges and the pair counts."""
    work = storage.join(config.output_path, "work")
    routed_folder, edges_folder = storage.join(work, "verify-first"), storage.join(work, "edges")
    first_shards = [Shard(f"{i:05d}", _VerifyPayload(config, i, candidates_folder)) for i in range(files)]
    routed = run_sharded(routed_folder, first_shards, _verify_first_shard, description="verify pairs (first side)")
    second_shards = [Shard(f"{i:05d}", _VerifyPayload(config, i, routed_folder)) for i in range(files)]
    verified = run_sharded(edges_folder, second_shards, _verify_second_shard, description="verify pairs (second side)")
    counts = {"candidate_pairs": sum(marker["stats"]["candidate_pairs"] for marker in routed.markers.values())}
    for name in ("verified_pairs", "rejected_pairs"):
        counts[name] = sum(marker["stats"][name] for marker in verified.markers.values())
    return edges_folder, counts


def fuzzy_dedup(config: FuzzyDedupConfig) -> None:
    if not 0 <= config.jaccard_threshold <= 1:
        raise ValueError(f"jaccard_threshold must be in [0, 1], got {config.jaccard_threshold}")
    files = list_input_files(config.input_paths)
    work = storage.join(config.output_path, "work")
    per_file = file_shards(config, files)
    minhash_folder = storage.join(work, "minhash")
    signature_report = run_sharded(minhash_folder, per_file, _signature_shard, description="minhash signatures")
    partitions = [f"b{band:03d}-h{hash_range:03d}" for band in range(config.bands)
                  for hash_range in range(config.hash_ranges)]  # fmt: skip
    buckets_folder = storage.join(minhash_folder, "buckets")
    candidates_folder = storage.join(work, "candidates")
    bucket_shards = [Shard(name, _BucketPayload(buckets_folder, name, config.all_pairs_bucket_size))
                     for name in partitions]  # fmt: skip
    run_sharded(candidates_folder, bucket_shards, _bucket_shard, description="lsh buckets")
    edges_folder, pair_counts = _verify(config, len(files), candidates_folder)
    converged = connected_components(storage.join(work, "components"), edges_folder, config.node_partitions)
    assign_shards = [Shard(f"{p:04d}", _AssignPayload(converged, p)) for p in range(config.node_partitions)]
    run_sharded(storage.join(work, "assign"), assign_shards, _assign_shard, description="cluster assignment")
    filter_report = run_sharded(config.output_path, per_file, _filter_shard, description="fuzzy filter")
    stats = merge_stats(filter_report)
    stats.update(pair_counts)
    stats["docs_without_signature"] = sum(
        marker["stats"]["docs_without_signature"] for marker in signature_report.markers.values()
    )
    stats["settings"] = {
        "n_grams": config.n_grams,
        "bands": config.bands,
        "rows": config.rows,
        "jaccard_threshold": config.jaccard_threshold,
    }
    write_stats(config.output_path, stats)
