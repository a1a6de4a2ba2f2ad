"""Pins: the bytes a published result depends on, written down, and runs that fail loudly when they differ.

    python -m executor pin experiments/hero_535b.py --prefix outputs   # -> experiments/hero_535b.pins.json
    python -m executor pin outputs/experiments/hero_535b-1a2b3c4d.json # -> .../hero_535b-1a2b3c4d.pins.json
    python experiments/hero_535b.py --pins experiments/hero_535b.pins.json

A pin file lists, for every finished step of an experiment, its name, version hash and output digest (the sha256
of its canonical manifest, records.output_digest), as Marin pins `expected_fingerprint`s. A run given the file:

- refuses, before anything runs or is written, a step whose name is pinned under another hash (its config, a
  dependency or its code_version drifted), naming both hashes and how to see why (`explain`);
- re-reads the files of every pinned step that is already SUCCESS and records FAILED, output kept, for one whose
  bytes do not give the pinned digest (a file edited or corrupted since), before any other step runs;
- checks a pinned step that runs at its commit: a digest other than the pinned one is FAILED (not SUCCESS), the
  output kept for inspection, both digests in the error.

Steps the file does not name run as usual; the dry run marks the pinned ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from executor.dag.plan import Plan, PlannedStep
from executor.errors import ConfigError
from executor.store import storage
from executor.store.events import committed_digest, now_iso, read_many_events
from executor.store.experiments import latest_experiment, read_experiment
from executor.store.layout import EXPERIMENTS_DIR

PIN_SUFFIX = ".pins.json"


class PinError(ConfigError):
    """A step's version hash or output digest is not the one its pin file holds."""


@dataclass(frozen=True)
class Pin:
    name: str
    hash: str
    output_digest: str


def pin_file_for(experiment: str) -> str:
    """Where `pin` writes by default: beside the experiment (`x.py` -> `x.pins.json`, `x.json` -> `x.pins.json`)."""
    return os.path.splitext(experiment)[0] + PIN_SUFFIX


def experiment_record_for(experiment: str, prefix: str) -> tuple[str, dict[str, Any]]:
    """The stored experiment record: the file itself, or for a script the newest record of it under `prefix`."""
    if experiment.endswith(".py"):
        script = os.path.splitext(os.path.basename(experiment))[0]
        found = latest_experiment(prefix, script)
        if found is None:
            where = storage.join(prefix, EXPERIMENTS_DIR)
            raise FileNotFoundError(f"no experiment file of {script!r} under {where}; run {experiment} first")
        return found, read_experiment(found)
    return experiment, read_experiment(storage.make_absolute(experiment))


def write_pins(experiment: str, prefix: str, to: str | None = None) -> tuple[str, list[Pin], list[str]]:
    """Pin every finished step of the experiment; returns the pin file's path, the pins and the steps left out
    (not SUCCESS, or finished before digests were recorded)."""
    record_path, record = experiment_record_for(experiment, prefix)
    steps = record["steps"]
    histories = read_many_events([step["output_path"] for step in steps])
    pins, left_out = [], []
    for step, events in zip(steps, histories, strict=True):
        digest = committed_digest(events)
        if digest is None:
            left_out.append(f"{step['name']} ({events[-1].status if events else 'never ran'})")
            continue
        pins.append(Pin(step["name"], step["hash"], digest))
    if not pins:
        raise PinError(f"{record_path}: no finished step to pin; run the experiment to the end first")
    destination = to or pin_file_for(experiment)
    document = {
        "experiment": record_path,
        "git_commit": record.get("git_commit"),
        "written": now_iso(),
        "steps": [dataclasses.asdict(pin) for pin in pins],
    }
    storage.write_atomic(destination, json.dumps(document, indent=1, sort_keys=True) + "\n")
    return destination, pins, left_out


def read_pins(path: str) -> list[Pin]:
    document = storage.read_json(storage.make_absolute(path))
    if document is None:
        raise PinError(f"no pin file at {path}; write one with `python -m executor pin EXPERIMENT`")
    try:
        return [Pin(entry["name"], entry["hash"], entry["output_digest"]) for entry in document["steps"]]
    except (KeyError, TypeError) as error:
        raise PinError(f"{path} is not a pin file (each step needs name, hash, output_digest): {error}") from error


def pins_for_plan(plan: Plan, pins: list[Pin], pin_file: str) -> dict[PlannedStep, str]:
    """Planned step -> its pinned digest; PinError naming every step pinned under another hash."""
    by_name: dict[str, list[Pin]] = {}
    for pin in pins:
        by_name.setdefault(pin.name, []).append(pin)
    pinned: dict[PlannedStep, str] = {}
    drifted = []
    for planned in plan.steps:
        candidates = by_name.get(planned.name, [])
        match = next((pin for pin in candidates if pin.hash == planned.hash), None)
        if match is not None:
            pinned[planned] = match.output_digest
        elif candidates:
            why = f"python -m executor explain {planned.output_path} shows what changed"
            drifted.append(
                f"{planned.name}: pinned hash {candidates[0].hash[:12]}…, this DAG's {planned.hash[:12]}… ({why})"
            )
    if drifted:
        raise PinError(
            f"{len(drifted)} step(s) drifted from their pins in {pin_file}; nothing was run or written: "
            f"{'; '.join(drifted)}. Put the config back, or re-pin on purpose with `python -m executor pin`"
        )
    return pinned


def mismatch_message(label: str, output_path: str, found: str, pinned: str, pin_file: str | None) -> str:
    """The error of a pinned step whose bytes are not the pinned ones."""
    return (
        f"{label}: output digest {found} is not the pinned {pinned} ({pin_file}); the output is kept for inspection "
        f"at {output_path} (python -m executor compare, verify); force_run the step to rebuild it, or re-pin on "
        "purpose with `python -m executor pin`"
    )
