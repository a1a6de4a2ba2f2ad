"""Intermediate arrays of the multi-stage data steps, stored by destination, and partition sizing.

A stage hands data to the next as npz files named `<stage folder>/to-<consumer>/from-<producer>.npz`:
the consumer of a shard, a band or a graph partition reads exactly one folder of its own. On an
object store a recursive listing (`find`, or a `glob` over `from-*/...`) returns every object under
the prefix, so a layout by producer (`from-S/to-T.npz`) makes each of N consumers list all N^2-scale
files of the stage; by destination, a consumer's one `ls` returns at most one object per producer
(datatrove's `bucket_XXX/` folders are the same idea). Empty slices are not written, so a listing
is how a consumer learns which producers sent it anything. The reads then go out concurrently.

Partition counts (hash ranges, node partitions, exact-dedup partitions) default to a size derived
from the input so that no shard's working set exceeds a memory budget: see `partitions_for` and the
memory model in `steps/README.md`. Each stage runs through `run_stage`, which hands that budget to
`run_sharded`: Ray reserves it per shard task, so a node never starts more shards than its memory holds.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from executor import Shard, ShardFn, ShardReport, ShardWriter, run_sharded, storage

DEFAULT_SHARD_MEMORY_BYTES = 2 * 1024**3
"""The working set a shard of a data step is sized to stay under, unless its config says otherwise."""


class StageSettings(Protocol):
    @property
    def parallelism(self) -> str: ...
    @property
    def shard_memory_bytes(self) -> int: ...


def run_stage(
    config: StageSettings, folder: str, shards: Sequence[Shard], fn: ShardFn, description: str
) -> ShardReport:
    """`run_sharded` with the step's parallelism and its shards' memory budget."""
    return run_sharded(folder, shards, fn, parallelism=config.parallelism, memory_bytes=config.shard_memory_bytes,
                       description=description)  # fmt: skip


def save_arrays(writer: ShardWriter, relative: str, **arrays: np.ndarray) -> None:
    sink = io.BytesIO()
    np.savez(sink, **arrays)  # type: ignore[arg-type]
    with writer.open(relative) as handle:
        handle.write(sink.getvalue())


def _decode(path: str, data: bytes | None) -> dict[str, np.ndarray]:
    if data is None:
        raise FileNotFoundError(f"{path} is missing; was the step's work folder deleted while it ran?")
    with np.load(io.BytesIO(data)) as loaded:
        return {name: loaded[name] for name in loaded.files}


def load_arrays(path: str) -> dict[str, np.ndarray]:
    return _decode(path, storage.read_bytes(path))


def routed_name(consumer: str, producer: str) -> str:
    """Where `producer` leaves data for `consumer`, relative to the stage's output folder."""
    return f"to-{consumer}/from-{producer}.npz"


def load_routed(stage_folder: str, consumer: str) -> list[dict[str, np.ndarray]]:
    """Every producer's arrays for `consumer`, in producer order: one listing of its own folder, concurrent reads."""
    folder = storage.join(stage_folder, f"to-{consumer}")
    paths = [storage.join(folder, name) for name in storage.list_names(folder) if name.endswith(".npz")]
    return [_decode(path, data) for path, data in zip(paths, storage.read_many(paths), strict=True)]


def column(loaded: list[dict[str, np.ndarray]], name: str, empty: np.ndarray) -> np.ndarray:
    """One column of every loaded file, concatenated (`empty`, shaped and typed like a row set, if none)."""
    return np.concatenate([empty] + [arrays[name] for arrays in loaded])


def save_routed(writer: ShardWriter, producer: str, destinations: np.ndarray, consumer_name: Callable[[int], str],
                folder: str = "", **columns: np.ndarray) -> None:  # fmt: skip
    """Split `columns` by destination (an int per row) and write each non-empty slice to its consumer's folder
    (`<folder>/to-<consumer>/from-<producer>.npz`, relative to the writer's stage)."""
    order = np.argsort(destinations, kind="stable")
    ordered = destinations[order]
    for destination in np.unique(ordered):
        rows = order[np.searchsorted(ordered, destination) : np.searchsorted(ordered, destination, side="right")]
        relative = routed_name(consumer_name(int(destination)), producer)
        save_arrays(writer, f"{folder}/{relative}" if folder else relative,
                    **{name: values[rows] for name, values in columns.items()})  # fmt: skip


def partitions_for(items: int, bytes_per_item: int, memory_bytes: int) -> int:
    """How many partitions keep `items` of `bytes_per_item` each (working set, not file size) under `memory_bytes`."""
    if memory_bytes <= 0:
        raise ValueError(f"the shard memory budget must be positive, got {memory_bytes}")
    return max(1, math.ceil(items * bytes_per_item / memory_bytes))
