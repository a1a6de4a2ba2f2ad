"""Greedy star clustering inside each connected component: every dropped document is verified against the kept one.

Why: connected components of verified pairs chain. With A ~ B ~ C (each pair above the threshold) but A and C
far apart, plain components put C in A's cluster and drop it although it duplicates nothing that is kept
(on the planted-corpus benchmark 0.7% of drops had Jaccard < 0.5 with their kept document). Jaccard
distance is a metric, so a chain of links at J >= 0.65 can end anywhere above J = 0: only a check against
the kept document itself bounds what a drop may differ by.

How (the greedy star clustering of "Pivot"-style correlation clustering, in input order): inside a
component, the first document is a representative; every other member whose estimated Jaccard with it (the
share of equal MinHash values) is at least the threshold joins it and is dropped; among those left, the
first becomes the next representative, and so on until every member has one. A dropped document therefore
always passed the threshold against the document its cluster keeps, and two members that pass it against
each other are never both kept (whichever comes first would have taken the other), so recall on
direct copies is what the pair verification gave. All components of a partition go round by round at
once in numpy; the rounds are as many as the largest component's representatives.

Three stages, each a set of shards through `run_stage`:

0. assign (one shard per converged node partition): (document, component root) for every node,
   routed to the document's input file, `work/assign/to-SSSSS/from-PPPP.npz`;
1. attach (one shard per input file S): the (document, component root) pairs routed to S by the
   assignment stage get their signatures from S's signature file and go to the root's node partition,
   `work/attach/to-PPPP/from-SSSSS.npz`, so that a component lands whole in one shard;
2. representatives (one shard per node partition): the greedy rounds; (document, representative) for
   every member of a cluster of two or more, routed back to the document's input file,
   `work/representatives/to-SSSSS/from-PPPP.npz`, which the fuzzy filter reads.

Memory: a representatives shard holds `REPRESENTATIVE_BYTES_PER_DOCUMENT` per clustered document of its
partition (a 384-byte signature, two keys, the sort and a round's gathered copies); partitions are
sized as if every input document were clustered. One component cannot be split: a component of N
documents needs ~2N KB in one shard (a million documents per 2 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from executor import ShardWriter, storage
from steps.data.arrays import column, load_arrays, load_routed, save_routed
from steps.dedup.connected_components import group_starts, read_partition, star_assignments
from steps.dedup.minhash import node_partition

REPRESENTATIVE_BYTES_PER_DOCUMENT = 2048
"""Working set of a representatives shard per clustered document: its 96 x 4 B signature twice (concatenated,
then sorted by (root, document)), and in the first round the members' and their pivots' gathered
signatures (2 x 384 B) and the comparison (96 B), plus keys and indexes."""


class MissingSignaturesError(ValueError):
    """A signature file lacks documents that later stages refer to: the work folder is stale or damaged."""


def shard_name(shard_index: int) -> str:
    return f"{shard_index:05d}"


def signatures_of(signatures_folder: str, shard_index: int, keys: np.ndarray, output_path: str) -> np.ndarray:
    """The MinHash signatures of `keys`, documents of input shard `shard_index`."""
    path = storage.join(signatures_folder, f"shard-{shard_name(shard_index)}.npz")
    stored = load_arrays(path)
    rows = np.searchsorted(stored["doc"], keys)
    if len(keys) and not np.array_equal(stored["doc"][np.minimum(rows, len(stored["doc"]) - 1)], keys):
        raise MissingSignaturesError(f"{path} lacks signatures of some clustered documents; delete "
                                     f"{output_path}/work and rerun the step")  # fmt: skip
    return stored["signature"][rows]


def greedy_representatives(root: np.ndarray, doc: np.ndarray, signature: np.ndarray, threshold: float
                           ) -> np.ndarray:  # fmt: skip
    """The representative of each document, for members sorted by (component root, document key).

    Round by round, each component's first unassigned member becomes a representative and takes every
    unassigned member of its component whose share of equal MinHash values with it is >= `threshold`."""
    representative = np.full(len(doc), -1, np.int64)
    left = np.arange(len(doc))
    while len(left):
        starts, run = group_starts(root[left])
        pivot = left[starts][run]
        similarity = np.mean(signature[left] == signature[pivot], axis=1)
        joins = (similarity >= threshold) | (left == pivot)
        representative[left[joins]] = doc[pivot[joins]]
        left = left[~joins]
    return representative


@dataclass(frozen=True)
class AssignPayload:
    components_folder: str
    partition: int


def assign_shard(payload: AssignPayload, writer: ShardWriter) -> dict[str, int]:
    """(document, component root) for every node of a converged partition, routed to the document's input file."""
    source, target = read_partition(payload.components_folder, payload.partition)
    nodes, roots = star_assignments(source, target)
    save_routed(writer, f"{payload.partition:04d}", nodes >> 32, shard_name, doc=nodes, root=roots)
    return {"rows": len(nodes), "clustered_docs": len(nodes), "dropped": int(np.sum(nodes != roots))}


@dataclass(frozen=True)
class AttachPayload:
    output_path: str
    """The step's output (named in errors)."""
    shard_index: int
    node_partitions: int


def attach_shard(payload: AttachPayload, writer: ShardWriter) -> dict[str, int]:
    """This input file's clustered documents with their signatures, routed to their root's partition."""
    work = storage.join(payload.output_path, "work")
    loaded = load_routed(storage.join(work, "assign"), shard_name(payload.shard_index))
    doc = column(loaded, "doc", np.zeros(0, np.int64))
    root = column(loaded, "root", np.zeros(0, np.int64))
    order = np.argsort(doc)
    doc, root = doc[order], root[order]
    signature = signatures_of(storage.join(work, "minhash", "signatures"), payload.shard_index, doc,
                              payload.output_path)  # fmt: skip
    save_routed(writer, shard_name(payload.shard_index), node_partition(root, payload.node_partitions),
                lambda partition: f"{partition:04d}", doc=doc, root=root, signature=signature)  # fmt: skip
    return {"rows": len(doc)}


@dataclass(frozen=True)
class RepresentativesPayload:
    attach_folder: str
    partition: int
    jaccard_threshold: float
    signature_width: int


def representatives_shard(payload: RepresentativesPayload, writer: ShardWriter) -> dict[str, int]:
    """Greedy clusters of this partition's components; (document, representative) to each document's file."""
    loaded = load_routed(payload.attach_folder, f"{payload.partition:04d}")
    doc = column(loaded, "doc", np.zeros(0, np.int64))
    root = column(loaded, "root", np.zeros(0, np.int64))
    signature = column(loaded, "signature", np.zeros((0, payload.signature_width), np.uint32))
    del loaded  # the per-producer copies; the concatenation is all that is needed from here
    order = np.lexsort((doc, root))
    doc, root, signature = doc[order], root[order], signature[order]
    representative = greedy_representatives(root, doc, signature, payload.jaccard_threshold)
    keys, sizes = np.unique(representative, return_counts=True)
    in_cluster = sizes[np.searchsorted(keys, representative)] > 1
    doc, representative = doc[in_cluster], representative[in_cluster]
    save_routed(writer, f"{payload.partition:04d}", doc >> np.int64(32), shard_name, doc=doc, root=representative)
    split = int(len(keys) - len(np.unique(root)))
    return {"rows": len(doc), "clustered_docs": len(doc), "dropped": int(np.sum(doc != representative)),
            "split_off": split, "kept_unclustered": int(np.sum(~in_cluster))}  # fmt: skip
