"""`data/tokens/<component>`: the tokens of each component a run has trained on, logged beside its loss.

The planned weights say what a run should eat; the data order (steps/train/data_order.py) says what it does:
block rounding, a phase that starts mid-block, a capped component leaving the mixture and skipped batches all
move the figures away from the plan. `TokensSeen` rebuilds the run's data order from the same data config and
trainer seed Levanter reads (only the mixture's bookkeeping: no sequence is read) and counts, for the batches
of steps 0..s, the sequences of each component, times the sequence length. The figures are cumulative and a
function of the step alone, so a resumed run or a fork logs the same ones as an uninterrupted run would.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from haliax import Axis
from levanter.schedule import BatchSchedule

from steps.train.data_order import DataOrder, OrderedLmDataConfig, levanter_data_key

PREFIX = "data/tokens/"


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
        return {f"{PREFIX}{name}": count * self.seq_len for name, count in sorted(sequences.items())}
