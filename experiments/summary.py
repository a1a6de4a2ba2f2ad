"""Print what each step of a finished run produced and where, from the steps' own stats.json."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from executor import Executor, ExecutorStep, read_status, storage


def print_summary(executor: Executor, steps: Sequence[ExecutorStep]) -> None:
    """One block per step: what this run did with it, its status, headline figures, output path."""
    verbs = {"run": "would run" if executor.dry_run else "ran", "skip": "skipped (already SUCCESS)", "wait": "waited"}
    print(f"\n{'Dry run over' if executor.dry_run else 'Outputs under'} {executor.prefix}:")
    for step in steps:
        output_path = executor.output_paths[step]
        decision = executor.decision_for(step)
        action = verbs[decision.action] if decision is not None else "not selected"
        status = read_status(output_path) or "no output yet"
        stats = storage.read_json(storage.join(output_path, "stats.json"))
        print(f"  {step.name}  (this run: {action}; status: {status})")
        if stats is not None:
            print(f"      {_headline(stats)}")
        print(f"      {output_path}")


def _headline(stats: dict[str, Any]) -> str:
    """The stats' top-level numbers and strings, plus the five most common words if listed."""
    parts = []
    for key, value in stats.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.3f}")
        elif isinstance(value, (int, str)) and not key.endswith("path") and key != "stdlib":
            parts.append(f"{key}={value}")
    if stats.get("top_words"):
        parts.append("top words: " + " ".join(str(word) for word, _count in stats["top_words"][:5]))
    return ", ".join(parts)
