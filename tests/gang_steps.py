"""A small JAX step for gang tests: every process contributes its devices' numbers to one global sum."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GlobalSumConfig:
    output_path: str


def global_sum(config: GlobalSumConfig) -> None:
    """Sum over a global array sharded over every device of every process; process 0 writes what it saw."""
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
        seen = {"sum": total, "devices": jax.device_count(), "processes": jax.process_count()}
        with open(os.path.join(config.output_path, "seen.json"), "w") as out:
            json.dump(seen, out)
