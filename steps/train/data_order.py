"""The order a run reads its training sequences in: mixture phases that start at any step, batches a rollback
skips, and per-component exposure caps that hold while sampling.

Levanter's `MixtureDataset` serves a mixture in blocks of `block_size` sequences, each block a shuffled, fixed
count per component, and changes weights only on whole blocks. `DataOrder` chains single-phase
`MixtureDataset`s, one per *segment* (a phase, or the rest of a phase once a component is capped), all on the
mixture's one key:

- segment 0 is exactly Levanter's mixture of the first phase, so the batches before a change are the ones a
  run that never changes reads;
- at a change (any sequence index, not only a block boundary), each component's read position moves to the
  end of the block it was in (a partly served block may have served any of its sequences) and the next segment
  reads on from there (Levanter's `start_offsets`): nothing read is read again, and at most one block's share
  per component is passed over. A change on a block boundary passes over nothing and reads exactly what
  Levanter's staged mixture reads;
- a component capped at `max_epochs` leaves the mixture at the first block that would read past
  `max_epochs x its length` (its weight goes to the others, in proportion), so it is never read past its cap;
- skipped ranges of the data order (a rollback past a loss spike) are never served: position t of the run
  reads the t-th sequence outside them.

All of it is a function of the configuration and the key: a resumed run (the loader's `iter_from_step`) reads
what an uninterrupted one does, and `sequences_before(t)` counts, per component, the sequences the first t
positions held. `TokensSeen` turns that into `data/tokens/<component>`, the tokens of each component a run has
trained on, which the metrics tracker logs beside each loss: not the planned weights but what was served
(block rounding, a phase starting mid-block, a capped component leaving, skipped batches). It rebuilds the
run's order from the data config and the trainer seed Levanter keys its data with (bookkeeping only: no
sequence is read), so a resumed run or a fork logs the figures an uninterrupted run would.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import jax
import numpy as np
from haliax import Axis
from jaxtyping import PRNGKeyArray
from levanter.data.dataset import AsyncDataset
from levanter.data.mixture import MixtureDataset, StopStrategy
from levanter.data.text.datasets import LmDataConfig, NamedLmDataset
from levanter.schedule import BatchSchedule
from levanter.utils.thread_utils import blocking_wait

T = TypeVar("T")
Phases = Sequence[tuple[int, Mapping[str, float]]]
"""[(first sequence index, {component: weight}), ...], the first at 0, in increasing order."""


class DataOrderError(ValueError):
    """The data order cannot serve the run (every component a phase weighs has reached its cap)."""


def levanter_data_key(seed: int) -> PRNGKeyArray:
    """The key `levanter.main.train_lm.main` hands the train set for a trainer seed (its first of four splits)."""
    return jax.random.split(jax.random.PRNGKey(seed), 4)[0]


def data_index(position: int, skipped: Sequence[tuple[int, int]]) -> int:
    """The data-order index that run position `position` reads: the position-th index outside `skipped`
    (sorted, disjoint [start, end) ranges)."""
    index = position
    for start, end in skipped:
        if index >= start:
            index += end - start
    return index


@dataclass(frozen=True)
class Segment:
    start: int
    """First data-order index it serves; it serves up to the next segment's start."""
    mixture: MixtureDataset
    """One phase's weights (capped components left out), reading on where the segment before left off."""


class DataOrder(AsyncDataset[T]):
    """The run's training sequences: `datasets` mixed by `phases`, `skipped` never served, no component read past
    `caps` (sequences; absent: uncapped, an exhausted component restarts as in Levanter). Segments are planned up
    to data index `horizon` (the run's end); the last one serves everything after."""

    def __init__(
        self,
        datasets: Mapping[str, AsyncDataset[T]],
        phases: Phases,
        *,
        block_size: int,
        key: PRNGKeyArray,
        horizon: int,
        skipped: Sequence[tuple[int, int]] = (),
        caps: Mapping[str, int] | None = None,
        where: str = "data order",
    ):
        super().__init__()
        self.block_size = block_size
        self.skipped = sorted((int(start), int(end)) for start, end in skipped)
        self.segments = _plan(datasets, phases, block_size, key, data_index(horizon, self.skipped), caps or {}, where)

    async def async_len(self) -> int:
        raise ValueError("a data order restarts its components: it has no length")

    def is_finite(self) -> bool:
        return False

    async def get_batch(self, indices: Sequence[int]) -> Sequence[T]:
        by_segment: dict[int, list[tuple[int, int]]] = {}
        for slot, position in enumerate(indices):
            index = data_index(int(position), self.skipped)
            by_segment.setdefault(self._segment_of(index), []).append((slot, index))
        numbers = list(by_segment)
        fetched = await asyncio.gather(
            *(self.segments[n].mixture.get_batch([index for _, index in by_segment[n]]) for n in numbers)
        )
        batch: list[T | None] = [None] * len(indices)
        for number, items in zip(numbers, fetched, strict=True):
            for (slot, _), item in zip(by_segment[number], items, strict=True):
                batch[slot] = item
        return batch  # type: ignore[return-value]

    def _segment_of(self, index: int) -> int:
        starts = [segment.start for segment in self.segments]
        return int(np.searchsorted(starts, index, side="right")) - 1

    def sequences_before(self, position: int) -> dict[str, int]:
        """Sequences of each component served at run positions [0, position)."""
        end = data_index(position, self.skipped)
        counts = self._served_between(0, end)
        for start, stop in self.skipped:
            if stop <= end:
                for name, count in self._served_between(start, stop).items():
                    counts[name] -= count
        return counts

    def _served_between(self, first: int, stop: int) -> dict[str, int]:
        counts: dict[str, int] = {}
        for number, segment in enumerate(self.segments):
            end = self.segments[number + 1].start if number + 1 < len(self.segments) else stop
            low, high = max(first, segment.start), min(stop, end)
            if low < high:
                upper, lower = _served_before(segment.mixture, high), _served_before(segment.mixture, low)
                for name in upper:
                    counts[name] = counts.get(name, 0) + upper[name] - lower[name]
        return counts


def _served_before(mixture: MixtureDataset, index: int) -> dict[str, int]:
    """Sequences of each component `mixture` serves at indices [0, index): whole blocks, then the shuffled
    block `index` falls in, up to it."""
    block, within = divmod(index, mixture.block_size)
    counts = mixture.sequence_counts_before_block(block)
    if within:
        ids, tally = np.unique(np.asarray(mixture._get_block(block))[:within] >> 16, return_counts=True)
        for dataset_id, count in zip(ids, tally, strict=True):
            counts[mixture.dataset_index[int(dataset_id)]] += int(count)
    return counts


def _plan(
    datasets: Mapping[str, AsyncDataset],
    phases: Phases,
    block_size: int,
    key: PRNGKeyArray,
    horizon: int,
    caps: Mapping[str, int],
    where: str,
) -> list[Segment]:
    """The segments up to `horizon`: a new one at each phase start and wherever a component reaches its cap."""
    read = dict.fromkeys(datasets, 0)  # per component, the next sequence it has not read
    capped: set[str] = set()
    segments: list[Segment] = []
    phase, start = 0, 0
    while not segments or start < horizon:
        weights = {name: weight for name, weight in phases[phase][1].items() if weight > 0 and name not in capped}
        if not weights:
            raise DataOrderError(
                f"{where}: from sequence {start} (phase {phase + 1}), every component the phase weighs has been "
                f"read max_epochs times ({sorted(capped)}); raise max_epochs, weigh more components or add data"
            )
        mixture = _reading_on(datasets, weights, block_size, key, read, start)
        cuts = _cap_cuts(mixture, caps, read, start)
        at_start = {name for name, cut in cuts.items() if cut <= start}
        if at_start:
            capped |= at_start
            continue
        next_phase = phases[phase + 1][0] if phase + 1 < len(phases) else None
        end = min([cut for cut in cuts.values()] + [horizon if next_phase is None else next_phase])
        segments.append(Segment(start, mixture))
        served = _served_before(mixture, -(-end // block_size) * block_size)
        replayed = _served_before(mixture, start // block_size * block_size)
        read.update({name: read[name] + served[name] - replayed[name] for name in mixture.dataset_index})
        capped |= {name for name, cut in cuts.items() if cut == end}
        if end == next_phase:
            phase += 1
        start = end
    return segments


def _reading_on(
    datasets: Mapping[str, AsyncDataset],
    weights: Mapping[str, float],
    block_size: int,
    key: PRNGKeyArray,
    read: Mapping[str, int],
    start: int,
) -> MixtureDataset:
    """A mixture of `weights` whose block holding `start` reads each component from `read` on."""

    def mixture(offsets: Mapping[str, int] | None) -> MixtureDataset:
        return MixtureDataset(datasets=datasets, weights=dict(weights), block_size=block_size, key=key,
                              stop_strategy=StopStrategy.RESTART_STRATEGY, start_offsets=offsets)  # fmt: skip

    plain = mixture(None)
    replayed = plain.sequence_counts_before_block(start // block_size)
    if all(read[name] == replayed[name] for name in plain.dataset_index):
        return plain
    return mixture({name: read[name] - replayed[name] for name in plain.dataset_index})


def _cap_cuts(mixture: MixtureDataset, caps: Mapping[str, int], read: Mapping[str, int], start: int) -> dict[str, int]:
    """Per capped component of `mixture`, the start of the first block that would read at or past its cap."""
    block_size = mixture.block_size
    per_block = mixture.sequence_counts_before_block(1)
    replayed = mixture.sequence_counts_before_block(start // block_size)
    cuts = {}
    for name in mixture.dataset_index:
        if name in caps and per_block[name] > 0:
            first_read = read[name] - replayed[name]  # what the mixture's block 0 would read first
            cuts[name] = (caps[name] - first_read) // per_block[name] * block_size
    return cuts


def caps_for(datasets: Mapping[str, AsyncDataset], max_epochs: float | None) -> dict[str, int]:
    """Each finite component's cap in sequences: `max_epochs` times its length (none without `max_epochs`)."""
    if max_epochs is None:
        return {}
    if not max_epochs > 0:
        raise DataOrderError(f"max_epochs must be positive (or None: uncapped), got {max_epochs}")
    return {
        name: int(max_epochs * blocking_wait(dataset.async_len()))
        for name, dataset in datasets.items()
        if dataset.is_finite()
    }


@dataclass(frozen=True)
class OrderedLmDataConfig(LmDataConfig):
    """Levanter's data config whose train set is a `DataOrder`; `train_weights` phases start at any step.

    Steps here count batches of the data order: a phase starting at step k, or a skip of steps [a, b), means the
    k-th (a-th) batch of the run that skips nothing, so a fork's settings speak of its parent's steps."""

    skip_steps: list[tuple[int, int]] = field(default_factory=list)
    """[first step, end step) ranges of the data order never trained on (sorted, disjoint)."""
    max_epochs: float | None = None
    """No component is read more than this many times its length (None: uncapped)."""
    num_train_steps: int = 0
    """The run's steps: segments are planned up to its end."""
    where: str = "data order"
    """Names the step in errors."""

    def train_set(self, pos: Axis, batch_schedule: BatchSchedule, *, key: PRNGKeyArray) -> NamedLmDataset:
        return NamedLmDataset(self.data_order(pos, batch_schedule, key=key), pos)

    def data_order(self, pos: Axis, batch_schedule: BatchSchedule, *, key: PRNGKeyArray) -> DataOrder:
        """The train set's order for Levanter's data `key`; the same split of it as `LmDataConfig.train_mixture`,
        so the order before any change is the one Levanter's own mixture gives."""
        mix_key, shuffle_key = jax.random.split(key)
        first_batch = batch_schedule.batch_size_at_step(0)
        datasets, _ = self._train_sets_and_caches(pos, key=shuffle_key, initial_batch_size=first_batch)
        weights = self.train_weights or {}
        phases = [(0, weights)] if isinstance(weights, dict) else weights
        offset = batch_schedule.global_data_offset_by_step
        return DataOrder(
            datasets,
            [(offset(step), phase) for step, phase in phases],
            block_size=self.mixture_block_size,
            key=mix_key,
            horizon=offset(self.num_train_steps),
            skipped=[(offset(first), offset(end)) for first, end in self.skip_steps],
            caps=caps_for(datasets, self.max_epochs),
            where=self.where,
        )


def ordered(config: LmDataConfig, **settings: object) -> OrderedLmDataConfig:
    """`config` as an `OrderedLmDataConfig` with `settings` (its fields beyond Levanter's)."""
    inherited = {item.name: getattr(config, item.name) for item in dataclasses.fields(config)}
    return OrderedLmDataConfig(**inherited, **settings)  # type: ignore[arg-type]


TOKENS_PREFIX = "data/tokens/"


@dataclass(frozen=True)
class TokensSeen:
    """What to count the tokens seen of: the run's data config, sequence length, batch size and trainer seed."""

    data: OrderedLmDataConfig
    seq_len: int
    batch_size: int
    seed: int

    @cached_property
    def _order(self) -> DataOrder:
        return self.data.data_order(Axis("position", self.seq_len), BatchSchedule(self.batch_size),
                                    key=levanter_data_key(self.seed))  # fmt: skip

    def after_step(self, step: int) -> dict[str, int]:
        """`data/tokens/<component>` once the batch of `step` (0-based) has been trained on."""
        sequences = self._order.sequences_before((step + 1) * self.batch_size)
        return {f"{TOKENS_PREFIX}{name}": count * self.seq_len for name, count in sorted(sequences.items())}
