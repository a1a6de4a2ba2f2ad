"""Connected components of a graph too large for one machine: large-star / small-star rounds.

The algorithm is Kiveris et al., "Connected Components in MapReduce and Beyond" (SoCC 2014).
Nodes are int64 document keys; an undirected edge {u, v} is stored twice, as (u, v) in the
partition of u and as (v, u) in the partition of v (`node_partition`), so each partition holds
every neighbour of its own nodes and a round is one parallel pass over partitions:

- large-star: at each node u with smallest neighbourhood member m = min({u} | N(u)), replace every
  edge to a *larger* neighbour v by (v, m);
- small-star: at each u, with N'(u) its smaller neighbours and m = min(N'(u) | {u}), replace the
  edges to N'(u) by edges from N'(u) | {u} to m.

Each pass writes, per partition, one edge file for every destination partition it has edges for,
stored by destination (`round-NNN/to-QQQQ/from-PPPP.npz`, see `steps/data/arrays.py`), committed shard
by shard with `run_sharded`, so a restarted step resumes at the first unfinished partition of the
first unfinished round. Before each large-star pass the
partitions count *violations*: nodes with two smaller neighbours, or with one smaller and any
larger neighbour. None left means every component is a star around its smallest node, i.e. each
non-root node's single smaller neighbour is its component id. The number of rounds is
O(log n); no partition ever needs more than its own nodes' edges, and no stage gathers the graph.

Memory: a partition holds its nodes' edges twice over (both directions, 16 bytes each) and
`np.unique` over the stacked pairs copies them a few times more; `EDGE_BYTES_PER_DOCUMENT` budgets
that per input document, assuming at most two verified edges per document (a duplicate has one
edge to its cluster after verification; near-copies of near-copies add a second).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from executor import Shard, ShardWriter, run_sharded, storage
from steps.data.arrays import column, load_routed, save_routed
from steps.dedup.minhash import node_partition

logger = logging.getLogger(__name__)


EDGE_BYTES_PER_DOCUMENT = 320
"""Working set of a node partition per input document: 2 edges x 2 directions x 16 bytes, times ~5 for the
concatenation, `np.unique`'s stacked copy and sort, and the star step's outputs."""


class ComponentsDidNotConvergeError(RuntimeError):
    """More rounds than `max_rounds`; the graph is stored round by round for inspection."""


def _partition_name(partition: int) -> str:
    return f"{partition:04d}"


def write_partitioned_edges(writer: ShardWriter, producer: str, first: np.ndarray, second: np.ndarray,
                            partitions: int) -> None:  # fmt: skip
    """Store undirected edges both ways, each in its source node's partition folder (`to-PPPP/from-<producer>`)."""
    sources = np.concatenate([first, second])
    targets = np.concatenate([second, first])
    save_routed(writer, producer, node_partition(sources, partitions), _partition_name, source=sources, target=targets)


def read_partition(folder: str, partition: int) -> tuple[np.ndarray, np.ndarray]:
    """Every edge stored for `partition` under `folder`, deduplicated, sorted by (source, target)."""
    loaded = load_routed(folder, _partition_name(partition))
    source = column(loaded, "source", np.zeros(0, np.int64))
    target = column(loaded, "target", np.zeros(0, np.int64))
    if not len(source):
        return source, target
    pairs = np.unique(np.stack([source, target], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def group_starts(source: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start index of each run of equal sources, and each edge's run number."""
    starts = np.flatnonzero(np.concatenate([[True], source[1:] != source[:-1]]))
    return starts, np.cumsum(np.concatenate([[True], source[1:] != source[:-1]])) - 1


def count_violations(source: np.ndarray, target: np.ndarray) -> int:
    if not len(source):
        return 0
    starts, run = group_starts(source)
    smaller = np.bincount(run, weights=target < source, minlength=len(starts))
    larger = np.bincount(run, weights=target > source, minlength=len(starts))
    return int(np.sum((smaller > 1) | ((smaller == 1) & (larger > 0))))


def large_star(source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts, run = group_starts(source)
    smallest = np.minimum(source[starts], np.minimum.reduceat(target, starts))[run]
    keep = target > source
    return target[keep], smallest[keep]


def small_star(source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = target < source
    source, target = source[keep], target[keep]
    if not len(source):
        return source, target
    starts, run = group_starts(source)
    smallest = np.minimum.reduceat(target, starts)[run]
    members = np.concatenate([target, source[starts]])
    roots = np.concatenate([smallest, smallest[starts]])
    differ = members != roots
    return members[differ], roots[differ]


@dataclass(frozen=True)
class _RoundPayload:
    input_folder: str
    partition: int
    partitions: int
    kind: str
    """"large" or "small"."""


def _round_shard(payload: _RoundPayload, writer: ShardWriter) -> dict[str, int]:
    source, target = read_partition(payload.input_folder, payload.partition)
    violations = count_violations(source, target) if payload.kind == "large" else 0
    star = large_star if payload.kind == "large" else small_star
    first, second = star(source, target) if len(source) else (source, target)
    write_partitioned_edges(writer, _partition_name(payload.partition), first, second, payload.partitions)
    return {"rows": len(first), "edges_in": len(source), "violations": violations}


def _run_round(work_path: str, number: int, input_folder: str, kind: str, partitions: int,
               parallelism: str, memory_bytes: int | None) -> tuple[str, int]:  # fmt: skip
    folder = storage.join(work_path, f"round-{number:03d}-{kind}")
    shards = [Shard(_partition_name(p), _RoundPayload(input_folder, p, partitions, kind)) for p in range(partitions)]
    report = run_sharded(
        folder,
        shards,
        _round_shard,
        parallelism=parallelism,
        memory_bytes=memory_bytes,
        description=f"components round {number} ({kind} star)",
    )
    violations = sum(marker["stats"].get("violations", 0) for marker in report.markers.values())
    return folder, violations


def connected_components(work_path: str, edges_folder: str, partitions: int, max_rounds: int = 64,
                         parallelism: str = "auto", memory_bytes: int | None = None) -> str:  # fmt: skip
    """Run rounds until the edges under `edges_folder` form stars; returns the converged folder.
    `memory_bytes`: what one partition's shard is sized for (see `run_sharded`)."""
    folder = edges_folder
    for number in range(max_rounds):
        output, violations = _run_round(work_path, 2 * number, folder, "large", partitions, parallelism, memory_bytes)
        logger.info("components round %d: %d violating node(s)", number, violations)
        if violations == 0:
            return folder
        folder, _ = _run_round(work_path, 2 * number + 1, output, "small", partitions, parallelism, memory_bytes)
    raise ComponentsDidNotConvergeError(f"{work_path}: no convergence in {max_rounds} rounds; see its round-* folders")


def star_assignments(source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In a converged star forest: (node, root) for every node of the partition, roots included."""
    if not len(source):
        return source, target
    starts, _run = group_starts(source)
    smallest = np.minimum(source[starts], np.minimum.reduceat(target, starts))
    return source[starts], smallest
