"""A small JAX step for gang tests: every process contributes its devices' numbers to one global sum."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class GlobalSumConfig:
    output_path: str


def global_sum(config: GlobalSumConfig) -> None:
    """Sum over a global array sharded over every device of every process; process 0 writes what it saw, with the
    young threshold of Python's garbage collector while the step ran (executor/run/collector.py)."""
    import gc

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("devices",))
    local = np.arange(jax.local_device_count(), dtype=np.float32) + 10 * jax.process_index()
    array = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("devices")), local)
    total = float(jax.jit(jnp.sum)(array))
    if jax.process_index() == 0:
        os.makedirs(config.output_path, exist_ok=True)
        seen = {"sum": total, "devices": jax.device_count(), "processes": jax.process_count(),
                "gc_young": gc.get_threshold()[0]}  # fmt: skip
        with open(os.path.join(config.output_path, "seen.json"), "w") as out:
            json.dump(seen, out)


@dataclass(frozen=True)
class CountedSumConfig:
    output_path: str
    iterations: int = 8
    pace_s: float = 0.0
    """Every member sleeps this long in each iteration: a slow gang that still advances."""
    stall_at: int | None = None
    """Member 1 of the first attempt sleeps `stall_s` inside this iteration while member 0 waits for it in the
    next collective: a gang whose members all answer their heartbeat but none advances."""
    stall_s: float = 0.0
    stop_at: int | None = None
    """Member 1 of the first attempt stops itself (SIGSTOP) inside this iteration: its heartbeat goes silent too."""
    raise_at: int | None = None
    """Member 1 raises `ValueError` inside this iteration, every attempt: a step's own bug, not a lost host."""
    checkpoint_every: int = 1
    """Process 0 checkpoints `state.json` after every this many iterations: a retried gang redoes the rest."""
    metrics: bool = False
    """Process 0 logs each iteration to metrics.jsonl (`step`, `time`, `sum`), as a train step logs its steps."""


def counted_sum(config: CountedSumConfig) -> None:
    """`iterations` global sums over every device of every process (each device's value plus the iteration),
    added up; each completed iteration reported to executor/run/gang_progress.py and checkpointed by process 0 to
    `state.json`, from which a retried gang resumes. Process 0 writes the total to `result.json`."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from executor import progress

    mesh = Mesh(np.array(jax.devices()), ("devices",))
    sharding = NamedSharding(mesh, PartitionSpec("devices"))
    state_file = os.path.join(config.output_path, "state.json")
    state = {"done": 0, "total": 0.0}
    if os.path.exists(state_file):
        with open(state_file) as handle:
            state = json.load(handle)
    total_of = jax.jit(jnp.sum)
    with progress.phase("iterating"):
        iterate(config, state, total_of, sharding)
    if jax.process_index() == 0:
        with open(os.path.join(config.output_path, "result.json"), "w") as out:
            json.dump(state, out)


def iterate(config: CountedSumConfig, state: dict, total_of, sharding) -> None:
    """The iterations left, in the step's progress phase (the gang's watch expects each to complete)."""
    import time

    import jax
    import numpy as np

    from executor import progress

    state_file = os.path.join(config.output_path, "state.json")
    for iteration in range(state["done"], config.iterations):
        stall_marker = os.path.join(config.output_path, "stalled-once")
        if jax.process_index() == 1 and iteration == config.stall_at and not os.path.exists(stall_marker):
            open(stall_marker, "w").close()
            time.sleep(config.stall_s)
        if jax.process_index() == 1 and iteration == config.stop_at and not os.path.exists(stall_marker):
            open(stall_marker, "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        if jax.process_index() == 1 and iteration == config.raise_at:
            raise ValueError(f"counted sum refuses iteration {iteration}")
        time.sleep(config.pace_s)
        local = np.arange(jax.local_device_count(), dtype=np.float32) + 10 * jax.process_index() + iteration
        total = float(total_of(jax.make_array_from_process_local_data(sharding, local)))
        state.update(done=iteration + 1, total=state["total"] + total)
        if jax.process_index() == 0 and config.metrics:
            with open(os.path.join(config.output_path, "metrics.jsonl"), "a") as log:
                log.write(json.dumps({"step": iteration, "time": time.time(), "sum": total}) + "\n")
        if jax.process_index() == 0 and state["done"] % config.checkpoint_every == 0:
            with open(state_file + ".tmp", "w") as out:
                json.dump(state, out)
            os.replace(state_file + ".tmp", state_file)
        progress.report(iteration)
