"""One host of a gang: a Ray actor that runs the step function as one JAX process of several.

The driver (executor/run/gang.py) places one `GangMember` per host in a placement group. Member 0 picks the
coordinator address (its node's IP and a free port on it) before any member starts; every member then calls
`jax.distributed.initialize(coordinator, hosts, rank)` and the step function, so each sees the global device
mesh. Its log records go to `<output>/logs/host-<rank>.log`, uploaded whenever the driver's heartbeat (`ping`)
comes and the last upload is `LOG_UPLOAD_S` old, and at the end; each heartbeat also puts the handler back on
the root logger (Levanter's trainer clears the root logger's handlers when it starts). The actor is threaded
(`max_concurrency=2`): `ping` is answered while `run` works, so a member that answers no ping is stopped or
wedged in native code, not merely busy; each answer carries the step the member last completed
(executor/run/gang_progress.py), so the driver also finds a gang that answers but no longer advances.

Stand-in hosts (`cpu_devices_per_host`): the member's process gets that many fake CPU devices
(`XLA_FLAGS`, set by the driver in the actor's environment before JAX loads: executor/run/cpu_devices.py) and
gloo collectives, which is how two hosts are tested on one machine.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from executor.run import gang_progress as progress
from executor.run.collector import rare_collections
from executor.store.processes import start_ticks
from executor.store.step_log import StepLog

logger = logging.getLogger(__name__)

LOG_UPLOAD_S = 10.0
"""A member's log is uploaded at most this often while it runs (each upload rewrites the whole file)."""
JAX_INIT_TIMEOUT_S = 300
"""How long `jax.distributed.initialize` waits for every member to join before it fails."""


def host_log_file(rank: int) -> str:
    """Where member `rank` keeps its log, relative to the step's output path."""
    return f"logs/host-{rank}.log"


def free_port() -> int:
    """A TCP port nothing listens on now (the coordinator binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


class GangMember:
    """One JAX process of a gang (used as a Ray actor: `ray.remote(GangMember)`)."""

    def __init__(self, rank: int, hosts: int, output_path: str, stand_in: bool):
        self.rank = rank
        self.hosts = hosts
        self.output_path = output_path
        self.stand_in = stand_in
        self._log: StepLog | None = None
        self._uploaded_at = 0.0

    def identity(self) -> dict[str, Any]:
        """Where this member runs: the dashboard's gang view and the driver's teardown check read it."""
        import ray

        context = ray.get_runtime_context()
        labels = dict(context.get_node_labels())
        return {"pid": os.getpid(), "started": start_ticks(os.getpid()), "node_id": context.get_node_id(),
                "ip": self.ip(), "labels": labels}  # fmt: skip

    def ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def coordinator_address(self) -> str:
        """Member 0 only: `ip:port` of the JAX coordinator it will start, on its own node."""
        return f"{self.ip()}:{free_port()}"

    def ping(self) -> dict[str, Any]:
        """The driver's heartbeat: this member's time and progress (executor/run/gang_progress.py); uploads the member's
        log now and then."""
        log = self._log
        if log is not None:
            log.reattach()  # within a heartbeat of the trainer's logging setup, which drops it
        if log is not None and time.monotonic() - self._uploaded_at > LOG_UPLOAD_S:
            self._uploaded_at = time.monotonic()
            try:
                log.upload()
            except OSError as error:  # the log stays local; the heartbeat must still answer
                logger.warning("%s: could not upload %s (%s)", self.output_path, log.target, error)
        return {"time": time.time(), "progress": progress.snapshot()}

    def run(self, fn: Callable[[Any], Any], config: Any, coordinator: str) -> dict[str, Any]:
        """Join the JAX processes of the gang, then run the step function as one of them; returns how far it got
        (executor/run/gang_progress.py), which the last heartbeat may not have seen."""
        root = logging.getLogger()
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        with StepLog(self.output_path, host_log_file(self.rank), all_threads=True) as log:
            self._log = log
            progress.reset()
            try:
                self._initialize_jax(coordinator)
                with rare_collections():
                    fn(config)
                return progress.snapshot()
            except BaseException as error:
                log.save_failure(error)
                raise
            finally:
                self._log = None

    def _initialize_jax(self, coordinator: str) -> None:
        import jax

        if self.stand_in:
            # CPU devices of several processes talk over gloo (TCP); the default has no cross-process collectives.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        logger.info("gang member %d of %d: joining the JAX coordinator at %s", self.rank, self.hosts, coordinator)
        jax.distributed.initialize(
            coordinator, num_processes=self.hosts, process_id=self.rank, initialization_timeout=JAX_INIT_TIMEOUT_S
        )
        logger.info(
            "gang member %d of %d: %d local of %d global devices",
            self.rank,
            self.hosts,
            jax.local_device_count(),
            jax.device_count(),
        )
