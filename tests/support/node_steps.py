"""A step for the node-loss and interrupt tests: it records where it runs, then waits for a gate file."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class GateConfig:
    output_path: str
    gate_file: str
    """The step finishes once this file exists (plain)."""
    record_dir: str
    """One record per attempt, with the Ray node id (plain)."""


def wait_for_gate(config: GateConfig) -> None:
    ray = sys.modules.get("ray")  # loaded in a Ray worker; a local run does not import it (seconds)
    os.makedirs(config.record_dir, exist_ok=True)
    node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else "local"
    record = {"node": node, "pid": os.getpid()}
    with open(os.path.join(config.record_dir, uuid.uuid4().hex), "w") as handle:
        json.dump(record, handle)
    while not os.path.exists(config.gate_file):
        time.sleep(0.05)
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "done.txt"), "w") as handle:
        handle.write(record["node"])


@dataclass(frozen=True)
class FifoConfig:
    output_path: str
    fifo: str
    """A named pipe: opening it for reading blocks, inside the kernel, until a writer opens it (plain)."""


def read_a_fifo(config: FifoConfig) -> None:
    """A step blocked in a native call: `open` of a FIFO no one writes never returns to Python, so no exception
    raised in its thread is seen until a writer comes."""
    with open(config.fifo, "rb") as handle:
        data = handle.read()
    os.makedirs(config.output_path, exist_ok=True)
    with open(os.path.join(config.output_path, "read.bin"), "wb") as handle:
        handle.write(data)
