"""Fake CPU JAX devices for a step (`ResourceConfig.cpu_devices_per_host`): stand-in hosts on one machine.

A gang of stand-in hosts changes only the process layout: its members share the global devices that one
process would have. For its result to equal a one-host run's, the one-host run must have the same global
devices, so a one-host step can ask for fake CPU devices too (`ResourceConfig(cpu_devices_per_host=2)`), and
`--hosts 2` spreads those same two devices over two processes. A different device count splits the batch's
sums differently, which a sign-driven router update or a top-k choice can amplify from the last bit up.

How a step's process gets its devices, by backend:

    gang member (executor/run/gang.py)  XLA_FLAGS in the Ray actor's runtime_env (`stand_in_environment`)
    ray backend, one host           the same, in the Ray task's runtime_env: Ray gives a task whose
                                    environment differs a worker process of its own, so no worker that
                                    already loaded JAX with another count runs it
    local backend                   steps run in this process, whose JAX has one device count, fixed at its
                                    first computation: the backend claims the count its steps ask for before
                                    any step runs (`claim_cpu_devices`); a step asking for another count is
                                    refused with a ConfigError that says to run it under `--backend ray`

Every such step's function is wrapped (`OnCpuDevices`), which claims its count in whatever process runs it,
so a mismatch is a clear error rather than a run on the wrong devices.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from executor.dag.spec import ResourceConfig
from executor.errors import ConfigError
from executor.run.step_task import StepTask

logger = logging.getLogger(__name__)


STAND_IN_XLA_FLAGS = ("--xla_backend_optimization_level=1",)
"""XLA flags of every process on fake CPU devices, beside their count: LLVM's optimisation level 1 instead of XLA's
2. A stand-in compiles much and runs little: on the tiny d768 rung (2 devices) the model's init compiled in 2.7 s
instead of 5.6 and the whole train step took ~15% less time, with losses equal to the bit and steps no slower.
A flag the process's XLA_FLAGS already set stands."""


UNOPTIMIZED_XLA_FLAG = "--xla_backend_optimization_level=0"
"""LLVM at -O0, for a process that compiles much and compares more than it trains: the memory probes (compiled,
never run) and the tests whose claim is one program against another under the same flags (microbatches against
the whole batch, expert parallelism against one device). IEEE arithmetic either way, at ~25% less CPU a compile
and slower steps: the router-microbatch tests took 107 CPU-s instead of 132, the expert-parallel ones 165 instead of
183; a whole train step's run (test_train_expert_parallel.py) gained nothing, its steps and evals ran slower."""


def stand_in_environment(cpu_devices_per_host: int | None) -> dict[str, str]:
    """Environment variables a step's (or gang member's) process needs before JAX loads: its fake CPU devices."""
    if cpu_devices_per_host is None:
        return {}
    flags = with_stand_in_flags(f"--xla_force_host_platform_device_count={cpu_devices_per_host}")
    return {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}


def with_stand_in_flags(xla_flags: str) -> str:
    """`xla_flags` plus each of `STAND_IN_XLA_FLAGS` whose flag it does not set already."""
    have = {flag.split("=")[0] for flag in xla_flags.split()}
    return " ".join([*xla_flags.split(), *(flag for flag in STAND_IN_XLA_FLAGS if flag.split("=")[0] not in have)])


def single_host_devices(resources: ResourceConfig | None) -> int | None:
    """The fake CPU devices a one-host step asks for (None: whatever its process has; gangs handle their own)."""
    if resources is None or resources.hosts > 1:
        return None
    return resources.cpu_devices_per_host


def claim_cpu_devices(count: int, label: str) -> None:
    """Give this process's JAX `count` CPU devices, or check that it already has them.

    Raises ConfigError when JAX here already started with another count (it cannot be changed in a running
    process)."""
    import jax

    try:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX here has already run something: its devices are fixed; check them
        have = len(jax.devices("cpu"))
        if have != count:
            raise ConfigError(
                f"{label} asks for {count} fake CPU devices (ResourceConfig.cpu_devices_per_host), but this "
                f"process's JAX already runs on {have} (a step before it, or XLA_FLAGS, fixed them). Run the DAG "
                "with --backend ray, which gives each device count a worker process of its own, or run this "
                "step alone (--run_only)"
            ) from None
        return
    os.environ["XLA_FLAGS"] = with_stand_in_flags(os.environ.get("XLA_FLAGS", ""))  # read when the backend starts
    logger.info("%s: this process's JAX runs on %d fake CPU devices", label, count)


def claim_for_steps(resources: Iterable[ResourceConfig | None]) -> None:
    """Local backend: before any step runs, claim the one device count its one-host steps ask for. Several
    different counts: claim none here; each step claims its own when it runs (the first wins)."""
    counts = {count for count in map(single_host_devices, resources) if count is not None}
    if len(counts) != 1:
        return
    try:
        claim_cpu_devices(counts.pop(), "this executor (local backend)")
    except ConfigError as error:  # each step that asks for them fails with this, naming itself, when it runs
        logger.warning("%s", error)


@dataclasses.dataclass(frozen=True)
class OnCpuDevices:
    """A step function that first claims its fake CPU devices in the process that runs it."""

    fn: Callable[[Any], Any]
    count: int
    label: str

    def __call__(self, config: Any) -> Any:
        claim_cpu_devices(self.count, self.label)
        return self.fn(config)


def on_cpu_devices(task: StepTask, resources: ResourceConfig | None) -> StepTask:
    """`task`, run on the fake CPU devices its one-host resources ask for (unchanged if they ask for none)."""
    count = single_host_devices(resources)
    if count is None:
        return task
    return dataclasses.replace(task, fn=OnCpuDevices(task.fn, count, task.label))
