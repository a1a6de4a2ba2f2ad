"""The mixture a train step planned against the one it served, per phase and component.

A train step's `mixture.json` holds its schedule (each phase's start step and the planned weights) and the
mixture's block size and batch size; its `metrics.jsonl` carries, with each loss, the tokens of each component
trained on so far (`data/tokens/<component>`, counted from the data order's sampling, not from the weights).
A phase's served tokens are the difference of those figures at its first and last step reached, and its
served share each component's part of them.

Levanter's mixture holds the weights exactly within a block of `block_size` sequences, but rounds each
component's count in a block down (the remainder goes to the largest): a block too small for the weights serves
a 1% component nothing and the largest far more than planned. `drifted` finds the components served more than
`tolerance` off their planned share over a phase of at least `min_blocks` blocks (shorter phases end mid-block,
where the served shares are a sample); the `mixture_drift` alert (alerts.py) and the dashboard's composition and
run views use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from executor.store.metrics_log import rows_by_step

TOKENS_PREFIX = "data/tokens/"


def served_by_phase(records: Iterable[Mapping[str, Any]], mixture: Any) -> dict[str, Any] | None:
    """Per phase: planned share, served share and tokens of each component (None: no schedule or no counts)."""
    schedule = mixture.get("schedule") if isinstance(mixture, dict) else None
    seen = {
        step: {key.removeprefix(TOKENS_PREFIX): value for key, value in row.items() if key.startswith(TOKENS_PREFIX)}
        for step, row in rows_by_step(records).items()
    }
    seen = {step: tokens for step, tokens in seen.items() if tokens}
    if not schedule or not seen:
        return None
    last = max(seen)
    names = sorted({name for tokens in seen.values() for name in tokens})
    steps_logged = sorted(seen)

    def before(step: int) -> dict[str, int]:
        """The figures once the steps before `step` were trained on (zero before the first)."""
        logged = [earlier for earlier in steps_logged if earlier < step]
        return seen[logged[-1]] if logged else {}

    block, batch = mixture.get("block_size"), mixture.get("batch_size")
    starts = [int(start) for start, _ in schedule] + [last + 1]
    phases = []
    for number, (start, weights) in enumerate(schedule):
        if start > last:
            break
        end = min(starts[number + 1], last + 1)
        first, upto = before(start), before(end)
        tokens = {name: upto.get(name, 0) - first.get(name, 0) for name in names}
        total, planned_total = sum(tokens.values()), sum(float(w) for w in weights.values()) or 1.0
        blocks = (end - start) * batch / block if isinstance(block, int) and isinstance(batch, int) and block else None
        phases.append({
            "start_step": start, "end_step": end - 1, "weights": weights, "tokens": tokens, "blocks": blocks,
            "planned": {name: float(weights.get(name, 0.0)) / planned_total for name in names},
            "served": {name: tokens[name] / total if total else 0.0 for name in names},
        })  # fmt: skip
    return {"step": last, "components": names, "phases": phases, "total": seen[last], "block_size": block}


def drifted(served: Mapping[str, Any] | None, tolerance: float, min_blocks: float) -> list[dict[str, Any]]:
    """Each (phase, component) served more than `tolerance` (relative) off its planned share, in a phase of at
    least `min_blocks` mixture blocks."""
    found = []
    for number, phase in enumerate((served or {}).get("phases", [])):
        if phase["blocks"] is None or phase["blocks"] < min_blocks:
            continue
        for name, planned in phase["planned"].items():
            share = phase["served"][name]
            if planned > 0 and abs(share - planned) > tolerance * planned:
                found.append({"phase": number, "start_step": phase["start_step"], "component": name,
                              "planned": planned, "served": share, "tokens": phase["tokens"][name]})  # fmt: skip
    return found
