"""Fuzzy dedup: MinHash + LSH, verified candidate pairs, components split into verified stars, one kept per star.

Stages, each a set of shards committed with `run_sharded` under `work/` (so a restart redoes only
unfinished shards of the first unfinished stage), none of which needs all data on one node. Every
hand-over is stored by destination (`steps/data/arrays.py`): a consumer lists one folder of its own.

1. signatures (one shard per input file S): MinHash each document (`steps/dedup/minhash.py`), streamed in
   batches of at most `BATCH_CHARS` characters, and write its signatures,
   `work/minhash/signatures/shard-S.npz`; fold each band into a 64-bit key and write, for every band
   and hash range, that partition's (key, document) pairs: `work/minhash/buckets/to-bBBB-hHHH/from-S.npz`.
2. buckets (one shard per band x hash range): sort the partition's pairs by key; documents that
   share a key are candidate pairs (all pairs of a small bucket, a star from the first document
   of a large one). Each pair goes to the input shard of its first document:
   `work/candidates/to-S/from-bBBB-hHHH.npz`.
3. verify, first side (one shard per input file S): the distinct pairs whose first document is in
   S get that document's signature attached and move on to the second document's shard T.
4. verify, second side (one shard per input file T): each pair's Jaccard similarity is estimated
   as the fraction of equal MinHash values, and pairs below `jaccard_threshold` are dropped. LSH
   alone links every pair that agrees on one band, which at 16 x 6 includes pairs at Jaccard
   0.4 a few percent of the time: on a few thousand stdlib files, the `encodings/cp*.py` codec
   tables (true Jaccard 0.36-0.48) collided this way and took precision down to 0.76-0.88.
   The surviving edges are written both ways into node partitions
   (`steps/dedup/connected_components.py`). A pair joins stages 3 and 4 like a distributed hash join:
   no shard reads more signatures than those of its own input file.
5. components: large-star / small-star rounds over node partitions until every component is a
   star around its smallest document key, which is the first document in input order.
6. assign (one shard per node partition): (document, component root) pairs, routed to input files.
7. greedy clusters (`steps/dedup/representatives.py`): each component, whole in one shard, is split
   into stars around kept representatives, so a dropped document is verified against the one its
   cluster keeps (components alone chain: A ~ B ~ C dropped C for A although J(A, C) < 0.5).
8. filter (one shard per input file): keep a document unless its representative is another
   document; write the kept documents and `clusters/shard-SSSSS.parquet` (id, cluster_id, kept)
   for every clustered document, so anyone can see which document a dropped one matched.

"First in input order wins" is only right after quality filtering: a cluster whose first copy a
later filter drops would be lost whole. Pipelines therefore filter first and dedup after (as
FineWeb does; see `experiments/data_demo.py`).

The hash ranges and node partitions default to counts sized from the input (`shard_memory_bytes`);
the per-document costs are in `steps/README.md`. datatrove runs stage 5 on a single CPU over all
edges (their issue #106); here it is as parallel as stage 2. A cluster id is "SSSSS:ROW" of its
representative, which is the one kept.

Output: `docs/shard-*.parquet`, `clusters/shard-*.parquet`, `stats.json`, `work/` (intermediate).
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from executor import Shard, ShardWriter, storage
from steps.data.arrays import (
    DEFAULT_SHARD_MEMORY_BYTES,
    column,
    load_routed,
    partitions_for,
    run_stage,
    save_arrays,
    save_routed,
)
from steps.data.documents import (
    FileShard,
    ReadReport,
    doc_key,
    estimated_documents,
    file_shards,
    flow_stats,
    list_source_files,
    merge_stats,
    read_documents,
    shard_file,
    source_stats,
    split_key,
    text_bytes,
    to_table,
    write_stats,
    write_table,
)
from steps.dedup.connected_components import (
    EDGE_BYTES_PER_DOCUMENT,
    connected_components,
    write_partitioned_edges,
)
from steps.dedup.minhash import BATCH_CHARS, MAX_SHINGLED_CHARS, MinHasher, text_batches
from steps.dedup.representatives import (
    REPRESENTATIVE_BYTES_PER_DOCUMENT,
    AssignPayload,
    AttachPayload,
    RepresentativesPayload,
    assign_shard,
    attach_shard,
    representatives_shard,
    shard_name,
    signatures_of,
)

logger = logging.getLogger(__name__)

BUCKET_BYTES_PER_DOCUMENT = 128
"""Working set of a bucket shard per document of its band and hash range: 16 bytes stored (key,
document), the concatenation, the sort order and sorted copies, and `bucket_pairs`' index arrays."""


@dataclass(frozen=True)
class FuzzyDedupConfig:
    input_paths: list[str]
    """Document files, folders or globs (JSONL or Parquet), read in this order: earlier documents win."""
    output_path: str
    """Where docs/, clusters/, stats.json and work/ go (THIS_OUTPUT_PATH in a DAG)."""
    input_sources: list[str] | None = None
    """A source name for each entry of `input_paths` (one step over many sources): the kept documents of the
    files under `input_paths[i]` go to `docs/<input_sources[i]>/`, so each source's later steps read their own
    folder, and `stats.json` counts documents by source. None: one `docs/` folder. Versioned."""
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
    max_shingled_chars: int = MAX_SHINGLED_CHARS
    """Only a document's first this many characters are MinHashed (bounds memory on huge documents;
    copies that differ only past it count as equal). Versioned."""
    hash_ranges: int | None = None
    """Partitions of each band's key space for stage 2; None sizes them from the input so that a bucket
    shard stays under `shard_memory_bytes`. Layout only."""
    node_partitions: int | None = None
    """Partitions of the document graph for stages 5 and 6; None sizes them from the input. Layout only."""
    shard_memory_bytes: int = DEFAULT_SHARD_MEMORY_BYTES
    """The working set partition counts are sized for (see steps/README.md). Layout only."""
    parallelism: str = "auto"
    """How shards run: "auto" (Ray if initialized, else processes), "process" or "thread". Layout only."""
    raw_input: bool = True
    """Whether an input file with no usable document is an error (False for our own outputs)."""

    def hasher(self) -> MinHasher:
        return MinHasher(n_grams=self.n_grams, bands=self.bands, rows=self.rows, seed=self.seed,
                         max_chars=self.max_shingled_chars)  # fmt: skip

    def layout(self, documents: int) -> tuple[int, int, int]:
        """(hash ranges, node partitions, representative partitions) for about `documents` input documents;
        the last is sized as if every document were clustered."""
        budget = self.shard_memory_bytes
        hash_ranges = self.hash_ranges or partitions_for(documents, BUCKET_BYTES_PER_DOCUMENT, budget)
        node_partitions = self.node_partitions or partitions_for(documents, EDGE_BYTES_PER_DOCUMENT, budget)
        greedy = max(node_partitions, partitions_for(documents, REPRESENTATIVE_BYTES_PER_DOCUMENT, budget))
        return hash_ranges, node_partitions, greedy


def _bucket_name(band: int, hash_range: int) -> str:
    return f"b{band:03d}-h{hash_range:03d}"


@dataclass(frozen=True)
class _SignaturePayload:
    file: FileShard[FuzzyDedupConfig]
    hash_ranges: int


def _signature_shard(payload: _SignaturePayload, writer: ShardWriter) -> dict[str, int]:
    config, shard_index = payload.file.config, payload.file.shard_index
    hasher = config.hasher()
    report = ReadReport()
    texts = (document["text"][: config.max_shingled_chars]
             for document in read_documents(payload.file.path, report, config.raw_input))  # fmt: skip
    key_parts, band_parts, signature_parts, documents = [], [], [], 0
    for batch in text_batches(texts, BATCH_CHARS):
        signatures, has_signature = hasher.signatures(batch)
        rows = np.arange(documents, documents + len(batch))[has_signature]
        documents += len(batch)
        key_parts.append((np.int64(shard_index) << np.int64(32)) | rows.astype(np.int64))
        band_parts.append(hasher.band_keys(signatures[has_signature]))
        signature_parts.append(signatures[has_signature])
    keys = np.concatenate([np.zeros(0, np.int64), *key_parts])
    bands = np.concatenate([np.zeros((0, config.bands), np.uint64), *band_parts])
    all_signatures = np.concatenate([np.zeros((0, config.bands * config.rows), np.uint32), *signature_parts])
    save_arrays(writer, f"signatures/shard-{shard_name(shard_index)}.npz", doc=keys, signature=all_signatures)
    ranges = ((bands >> np.uint64(32)) % np.uint64(payload.hash_ranges)).astype(np.int64)
    for band in range(config.bands):
        save_routed(writer, shard_name(shard_index), ranges[:, band], functools.partial(_bucket_name, band),
                    folder="buckets", band_key=bands[:, band], doc=keys)  # fmt: skip
    stats = flow_stats(report, 0, 0)
    stats["docs_without_signature"] = int(documents - len(keys))
    return stats


@dataclass(frozen=True)
class _BucketPayload:
    buckets_folder: str
    partition: str
    all_pairs_up_to: int


def _bucket_shard(payload: _BucketPayload, writer: ShardWriter) -> dict[str, int]:
    loaded = load_routed(payload.buckets_folder, payload.partition)
    band_key, doc = column(loaded, "band_key", np.zeros(0, np.uint64)), column(loaded, "doc", np.zeros(0, np.int64))
    order = np.lexsort((doc, band_key))
    earlier, later = bucket_pairs(band_key[order], doc[order], payload.all_pairs_up_to)
    save_routed(writer, payload.partition, earlier >> np.int64(32), shard_name, first=earlier, second=later)
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


@dataclass(frozen=True)
class _VerifyPayload:
    config: FuzzyDedupConfig
    shard_index: int
    pairs_folder: str
    """The stage folder whose `to-SSSSS/` holds the pairs routed to this shard."""
    node_partitions: int


def _signatures_of(config: FuzzyDedupConfig, shard_index: int, keys: np.ndarray) -> np.ndarray:
    """The MinHash signatures of `keys`, documents of input shard `shard_index`."""
    folder = storage.join(config.output_path, "work", "minhash", "signatures")
    return signatures_of(folder, shard_index, keys, config.output_path)


def _pairs_for(payload: _VerifyPayload) -> tuple[list[dict[str, np.ndarray]], np.ndarray, np.ndarray]:
    loaded = load_routed(payload.pairs_folder, shard_name(payload.shard_index))
    empty = np.zeros(0, np.int64)
    return loaded, column(loaded, "first", empty), column(loaded, "second", empty)


def _verify_first_shard(payload: _VerifyPayload, writer: ShardWriter) -> dict[str, int]:
    """Distinct pairs whose first document is in this shard, with its signature, routed to the second's shard."""
    _loaded, first, second = _pairs_for(payload)
    pairs = np.unique(np.stack([first, second], axis=1), axis=0) if len(first) else np.zeros((0, 2), np.int64)
    signature = _signatures_of(payload.config, payload.shard_index, pairs[:, 0])
    save_routed(writer, shard_name(payload.shard_index), pairs[:, 1] >> np.int64(32), shard_name,
                first=pairs[:, 0], second=pairs[:, 1], first_signature=signature)  # fmt: skip
    return {"rows": len(pairs), "candidate_pairs": len(pairs)}


def _verify_second_shard(payload: _VerifyPayload, writer: ShardWriter) -> dict[str, int]:
    """Keep the pairs whose second document is in this shard and whose MinHash similarity is high enough."""
    config = payload.config
    loaded, first, second = _pairs_for(payload)
    first_signature = column(loaded, "first_signature", np.zeros((0, config.bands * config.rows), np.uint32))
    similarity = np.mean(first_signature == _signatures_of(config, payload.shard_index, second), axis=1)
    kept = similarity >= config.jaccard_threshold
    write_partitioned_edges(writer, shard_name(payload.shard_index), first[kept], second[kept],
                            payload.node_partitions)  # fmt: skip
    return {"rows": int(kept.sum()), "verified_pairs": int(kept.sum()), "rejected_pairs": int((~kept).sum())}


def _cluster_id(key: int) -> str:
    shard_index, row = split_key(key)
    return f"{shard_index:05d}:{row}"


def _filter_shard(payload: FileShard[FuzzyDedupConfig], writer: ShardWriter) -> dict[str, object]:
    work = storage.join(payload.config.output_path, "work")
    loaded = load_routed(storage.join(work, "representatives"), shard_name(payload.shard_index))
    roots: dict[int, int] = {}
    for arrays in loaded:
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
    write_table(writer, shard_file(payload.shard_index, payload.source), to_table(kept))
    cluster_schema = pa.schema([("id", pa.string()), ("cluster_id", pa.string()), ("kept", pa.bool_())])
    clusters = pa.Table.from_pylist(clustered, schema=cluster_schema)
    write_table(writer, f"clusters/shard-{shard_name(payload.shard_index)}.parquet", clusters)
    stats = flow_stats(report, len(kept), text_bytes(document["text"] for document in kept))
    stats["dropped"] = {"fuzzy_duplicate": report.docs - len(kept)}
    stats.update(source_stats(payload.source, report.docs, len(kept)))
    return stats


def _verify(config: FuzzyDedupConfig, files: int, candidates_folder: str, node_partitions: int
            ) -> tuple[str, dict[str, int]]:  # fmt: skip
    """Stages 3 and 4; returns the folder of verified edges and the pair counts."""
    work = storage.join(config.output_path, "work")
    routed_folder, edges_folder = storage.join(work, "verify-first"), storage.join(work, "edges")
    first_shards = [Shard(shard_name(i), _VerifyPayload(config, i, candidates_folder, node_partitions))
                    for i in range(files)]  # fmt: skip
    routed = run_stage(config, routed_folder, first_shards, _verify_first_shard, "verify pairs (first side)")
    second_shards = [Shard(shard_name(i), _VerifyPayload(config, i, routed_folder, node_partitions))
                     for i in range(files)]  # fmt: skip
    verified = run_stage(config, edges_folder, second_shards, _verify_second_shard, "verify pairs (second side)")
    counts = {"candidate_pairs": sum(marker["stats"]["candidate_pairs"] for marker in routed.markers.values())}
    for name in ("verified_pairs", "rejected_pairs"):
        counts[name] = sum(marker["stats"][name] for marker in verified.markers.values())
    return edges_folder, counts


def _candidates(config: FuzzyDedupConfig, files: list[str], hash_ranges: int) -> tuple[str, int]:
    """Stages 1 and 2; returns the folder of candidate pairs and how many documents had no signature."""
    work = storage.join(config.output_path, "work")
    minhash_folder, candidates_folder = storage.join(work, "minhash"), storage.join(work, "candidates")
    signature_shards = [Shard(shard.shard_id, _SignaturePayload(shard.payload, hash_ranges))
                        for shard in file_shards(config, files)]  # fmt: skip
    signed = run_stage(config, minhash_folder, signature_shards, _signature_shard, "minhash signatures")
    buckets_folder = storage.join(minhash_folder, "buckets")
    partitions = itertools.starmap(_bucket_name, itertools.product(range(config.bands), range(hash_ranges)))
    pairs_up_to = config.all_pairs_bucket_size
    bucket_shards = [Shard(name, _BucketPayload(buckets_folder, name, pairs_up_to)) for name in partitions]
    run_stage(config, candidates_folder, bucket_shards, _bucket_shard, "lsh buckets")
    unsigned = sum(marker["stats"]["docs_without_signature"] for marker in signed.markers.values())
    return candidates_folder, unsigned


def _clusters(config: FuzzyDedupConfig, files: int, edges_folder: str, node_partitions: int,
              greedy_partitions: int) -> dict[str, int]:  # fmt: skip
    """Stages 5-7: components, their members routed back to input files, then greedy clusters inside each
    component (`steps/dedup/representatives.py`); returns how many documents the greedy stage split off."""
    work = storage.join(config.output_path, "work")
    converged = connected_components(storage.join(work, "components"), edges_folder, node_partitions,
                                     parallelism=config.parallelism,
                                     memory_bytes=config.shard_memory_bytes)  # fmt: skip
    assign_shards = [Shard(f"{p:04d}", AssignPayload(converged, p)) for p in range(node_partitions)]
    run_stage(config, storage.join(work, "assign"), assign_shards, assign_shard, "cluster assignment")
    attach_folder = storage.join(work, "attach")
    attach_shards = [Shard(shard_name(i), AttachPayload(config.output_path, i, greedy_partitions))
                     for i in range(files)]  # fmt: skip
    run_stage(config, attach_folder, attach_shards, attach_shard, "attach signatures to components")
    width = config.bands * config.rows
    greedy_shards = [Shard(f"{p:04d}", RepresentativesPayload(attach_folder, p, config.jaccard_threshold, width))
                     for p in range(greedy_partitions)]  # fmt: skip
    report = run_stage(config, storage.join(work, "representatives"), greedy_shards, representatives_shard,
                       "greedy clusters around kept documents")  # fmt: skip
    return {name: sum(marker["stats"][name] for marker in report.markers.values())
            for name in ("split_off", "kept_unclustered")}  # fmt: skip


def fuzzy_dedup(config: FuzzyDedupConfig) -> None:
    if not 0 <= config.jaccard_threshold <= 1:
        raise ValueError(f"jaccard_threshold must be in [0, 1], got {config.jaccard_threshold}")
    files, sources = list_source_files(config.input_paths, config.input_sources, f"fuzzy dedup at {config.output_path}")
    hash_ranges, node_partitions, greedy_partitions = config.layout(estimated_documents(files))
    candidates_folder, unsigned = _candidates(config, files, hash_ranges)
    edges_folder, pair_counts = _verify(config, len(files), candidates_folder, node_partitions)
    greedy_counts = _clusters(config, len(files), edges_folder, node_partitions, greedy_partitions)
    filter_shards = file_shards(config, files, sources)
    filter_report = run_stage(config, config.output_path, filter_shards, _filter_shard, "fuzzy filter")
    stats = merge_stats(filter_report)
    stats.update(pair_counts)
    stats["chain_splits"] = greedy_counts
    stats["docs_without_signature"] = unsigned
    stats["layout"] = {"hash_ranges": hash_ranges, "node_partitions": node_partitions,
                       "representative_partitions": greedy_partitions}  # fmt: skip
    stats["settings"] = {
        "n_grams": config.n_grams,
        "bands": config.bands,
        "rows": config.rows,
        "jaccard_threshold": config.jaccard_threshold,
        "max_shingled_chars": config.max_shingled_chars,
    }
    write_stats(config.output_path, stats)
