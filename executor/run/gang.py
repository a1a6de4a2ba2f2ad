"""A step that spans hosts runs as a gang: one Ray actor per host, one JAX process each, watched as one.

`ResourceConfig(hosts=N)` with N > 1 makes the backend run the step through `gang_task`: the step's lease,
heartbeat, status and retries stay with the executor's own thread (the driver), whose "step function" is
`GangLaunch`, which

    reserves a placement group of N bundles (one per host: its CPUs, accelerators and custom resources;
        STRICT_SPREAD on a cluster, PACK when one machine stands in for the hosts)
    -> starts N `GangMember` actors (executor/run/gang_member.py), asks member 0 for a coordinator address
    -> runs the step function in every member, each joined by `jax.distributed.initialize`
    -> watches them: each run's result, a heartbeat (`ping`) answered within `hang_timeout_s`, and, for a step
       function that reports its steps (executor/run/gang_progress.py), that some member completes one within
       `hang_timeout_s` (`first_step_timeout_s` to the first, `checkpoint_timeout_s` while one saves,
       `eval_timeout_s` while one evaluates)
    -> tears the whole gang down (every actor killed, the placement group removed, and, for members on
       this node, their processes checked gone), whatever happened.

A member that dies or hangs, or a gang that stops advancing, fails the attempt with `GangMemberLostError`, a
`TransientError`: the executor's retry starts a new gang, and the step (the train step) resumes from its latest
complete checkpoint. A member
whose step function raises fails the attempt with that error (a bad input stays a deterministic failure),
unless another member died within `DEATH_GRACE_S` (a lost peer makes the others' collectives fail too).
The driver records the gang in `<output>/gang.json` (hosts, placement, coordinator, each member's node, pid
and state) for the dashboard's step page.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from executor.dag.spec import ResourceConfig
from executor.errors import ConfigError
from executor.retry import TransientError
from executor.run import gang_progress as progress
from executor.run.cpu_devices import stand_in_environment
from executor.run.gang_member import GangMember
from executor.run.step_task import StepTask
from executor.store import storage
from executor.store.layout import GANG_FILE
from executor.store.processes import is_running

logger = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"
"""Ray's label of a node's own id: its topology strategy is the placement strategy across nodes."""
POLL_S = 1.0
"""How often the driver looks at its members (results and heartbeats): each member is pinged at most once in that
time (re-pinging as soon as an answer came back kept a driver thread and every member busy: ~40 CPU-s of the driver
in a 3-minute gang, and each member answering)."""
DEATH_GRACE_S = 10.0
"""After a member's step function raises, how long the driver waits for news of a dead peer."""
TEARDOWN_TIMEOUT_S = 30.0
"""How long the teardown waits for the killed members to be gone before it kills what is left itself."""
KILL_WAIT_S = 10.0
"""How long it then waits for a member it sent SIGKILL to be gone (under load, an exit takes a while)."""


class GangMemberLostError(TransientError):
    """A gang member died or hung: the gang was torn down and the attempt is retried as a new gang."""


def placement_strategy(resources: ResourceConfig) -> str:
    """STRICT_SPREAD (one host per node) on a cluster; PACK when stand-in hosts share one machine."""
    return "PACK" if resources.cpu_devices_per_host is not None else "STRICT_SPREAD"


def placement_description(resources: ResourceConfig) -> str:
    """How the gang is placed, for gang.json: the strategy, and the domains where it is placed by domain."""
    if resources.hosts_per_domain is None:
        return placement_strategy(resources)
    domains, strategy = resources.hosts // resources.hosts_per_domain, placement_strategy(resources)
    return f"{domains} x {resources.hosts_per_domain} hosts, {strategy} within one {resources.domain_label}"


def placement_groups(resources: ResourceConfig) -> list[dict[str, Any]]:
    """The placement groups a gang asks Ray for, as `ray.util.placement_group` keyword arguments, in rank order: one
    group of every host (`placement_strategy`), or, with `domain_label`, one group per fast domain of
    `hosts_per_domain` hosts, each one host per node on nodes that share the label's value (Ray's
    `topology_strategy`), so ranks `k * hosts_per_domain ...` share a domain and an expert group never spans two."""
    bundles = bundle_specs(resources)
    if resources.domain_label is None or resources.hosts_per_domain is None:
        return [{"bundles": bundles, "strategy": placement_strategy(resources)}]
    within = {NODE_ID_LABEL: placement_strategy(resources), resources.domain_label: "STRICT_PACK"}
    size = resources.hosts_per_domain
    return [{"bundles": bundles[start : start + size], "topology_strategy": dict(within)}
            for start in range(0, resources.hosts, size)]  # fmt: skip


def bundle_specs(resources: ResourceConfig) -> list[dict[str, float]]:
    """One placement-group bundle per host: what one host's process asks of its node."""
    accelerated = bool(resources.gpus or resources.accelerator_type or resources.custom)
    cpus = resources.cpus if resources.cpus is not None else (0 if accelerated else 1)
    bundle: dict[str, float] = {"CPU": cpus}
    if resources.gpus:
        bundle["GPU"] = resources.gpus
    if resources.memory_gb:
        bundle["memory"] = int(resources.memory_gb * 2**30)
    if resources.accelerator_type:
        bundle[f"accelerator_type:{resources.accelerator_type}"] = 0.001  # how Ray labels a node's accelerators
    bundle.update(resources.custom)
    bundle = {name: amount for name, amount in bundle.items() if amount}
    return [dict(bundle) for _ in range(resources.hosts)]


def member_options(resources: ResourceConfig, groups: list[Any], rank: int) -> dict[str, Any]:
    """Ray actor options of member `rank`: all of its bundle (in its domain's group), its stand-in environment, no
    restarts."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    per_group = resources.hosts // len(groups)

    bundle = bundle_specs(resources)[rank]
    custom = {name: amount for name, amount in bundle.items() if name not in ("CPU", "GPU", "memory")}
    options: dict[str, Any] = {
        "num_cpus": bundle.get("CPU", 0),
        "num_gpus": bundle.get("GPU", 0),
        "max_restarts": 0,
        "max_concurrency": 2,  # `run` and the driver's `ping`
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            groups[rank // per_group], placement_group_bundle_index=rank % per_group
        ),
        "runtime_env": {"env_vars": stand_in_environment(resources.cpu_devices_per_host)},
    }
    if "memory" in bundle:
        options["memory"] = bundle["memory"]
    if custom:
        options["resources"] = custom
    return options


@dataclass
class MemberRecord:
    """What the driver knows of one member; `gang.json` holds these."""

    rank: int
    state: str = "starting"
    """starting, running, finished, failed, died, hung, stalled (the gang stopped advancing), torn down."""
    pid: int | None = None
    started: int | None = None
    """Its process's start time (clock ticks after boot): with `pid`, names that process across pid reuse."""
    node_id: str | None = None
    ip: str | None = None
    last_heartbeat: float | None = None
    heartbeats: int = 0
    """Heartbeats it answered: at most one per `POLL_S`."""
    progress_step: int | None = None
    """The last step it completed (executor/run/gang_progress.py), as its latest heartbeat said."""
    domain: str | None = None
    """Its node's fast domain (the value of `ResourceConfig.domain_label`), where the gang is placed by domain."""


@dataclass
class GangRecord:
    hosts: int
    placement: str
    started: float = field(default_factory=time.time)
    state: str = "starting"
    coordinator: str | None = None
    message: str | None = None
    members: list[MemberRecord] = field(default_factory=list)


class GangLaunch:
    """The driver side of a gang step: run by `run_step` in place of the step function (see the module doc)."""

    def __init__(self, fn: Callable[[Any], Any], resources: ResourceConfig, output_path: str, label: str):
        self.fn = fn
        self.resources = resources
        self.output_path = output_path
        self.label = label

    def __call__(self, config: Any) -> None:
        gang = _Gang(self, config)
        try:
            gang.start()
            gang.watch()
        finally:
            gang.tear_down()


def gang_task(task: StepTask, resources: ResourceConfig) -> StepTask:
    """`task` with its step function run as a gang of `resources.hosts` members."""
    if resources.hosts < 2:
        raise ConfigError(f"{task.label}: a gang needs at least 2 hosts, the step asks for {resources.hosts}")
    return dataclasses.replace(task, fn=GangLaunch(task.fn, resources, task.output_path, task.label))


class _Gang:
    """One attempt's gang: its placement group, actors and records."""

    def __init__(self, launch: GangLaunch, config: Any):
        import ray

        self._ray = ray
        self.launch = launch
        self.config = config
        resources = launch.resources
        self.record = GangRecord(hosts=resources.hosts, placement=placement_description(resources))
        self.record.members = [MemberRecord(rank) for rank in range(resources.hosts)]
        self.groups: list[Any] = []
        self.actors: list[Any] = []

    def start(self) -> None:
        from ray.util.placement_group import placement_group

        resources = self.launch.resources
        self.groups = [placement_group(**spec) for spec in placement_groups(resources)]
        self._write()
        while not self._ray.wait([group.ready() for group in self.groups], num_returns=len(self.groups), timeout=60)[0]:
            logger.info(
                "%s: waiting for %d hosts (%s): %s",
                self.launch.label,
                resources.hosts,
                self.record.placement,
                bundle_specs(resources)[0],
            )
        member = self._ray.remote(GangMember)
        stand_in = resources.cpu_devices_per_host is not None
        for rank in range(resources.hosts):
            options = member_options(resources, self.groups, rank)
            self.actors.append(
                member.options(**options).remote(rank, resources.hosts, self.launch.output_path, stand_in)
            )
        identities = self._ray.get([actor.identity.remote() for actor in self.actors])
        for record, identity in zip(self.record.members, identities, strict=True):
            record.pid, record.started = identity["pid"], identity["started"]
            record.node_id, record.ip = identity["node_id"], identity["ip"]
            if resources.domain_label is not None:
                record.domain = identity["labels"].get(resources.domain_label)
            record.state, record.last_heartbeat = "running", time.time()
        self.record.coordinator = self._ray.get(self.actors[0].coordinator_address.remote())
        self.record.state = "running"
        self._write()
        logger.info(
            "%s: gang of %d hosts started (coordinator %s, pids %s)",
            self.launch.label,
            resources.hosts,
            self.record.coordinator,
            [m.pid for m in self.record.members],
        )

    def watch(self) -> None:
        """Wait for every member's run; raise on the first death, hang or failure (see the module doc)."""
        ray = self._ray
        runs = {
            actor.run.remote(self.launch.fn, self.config, self.record.coordinator): rank
            for rank, actor in enumerate(self.actors)
        }
        pings: dict[Any, int] = {}
        heard = {rank: time.monotonic() for rank in range(len(self.actors))}
        next_ping = dict.fromkeys(range(len(self.actors)), 0.0)
        resources = self.launch.resources
        advancing = progress.ProgressWatch(
            resources.progress_timeout_s or resources.hang_timeout_s,
            resources.first_step_timeout_s,
            resources.checkpoint_timeout_s,
            time.monotonic(),
            eval_timeout_s=resources.eval_timeout_s,
        )
        failure: tuple[int, BaseException] | None = None
        failed_at = 0.0
        while runs:
            now = time.monotonic()
            waiting_on = set(pings.values())
            for rank in runs.values():
                if rank not in waiting_on and now >= next_ping[rank]:
                    pings[self.actors[rank].ping.remote()] = rank
                    next_ping[rank] = now + POLL_S
            due = [next_ping[rank] for rank in runs.values() if rank not in pings.values()]
            wait_s = min(POLL_S, max(0.0, min(due, default=now + POLL_S) - now))
            ready, _ = ray.wait([*runs, *pings], num_returns=1, timeout=wait_s)
            for ref in ready:
                pinged = ref in pings
                rank = pings.pop(ref) if pinged else runs.pop(ref)
                answer, error = _result_of(ray, ref)
                if error is None:  # a heartbeat's answer carries its progress; a finished run's is its progress
                    reported = answer["progress"] if pinged else answer
                    advancing.heard(rank, reported, time.monotonic())
                    self.record.members[rank].progress_step = reported["step"]
                if isinstance(error, ray.exceptions.RayActorError):
                    self._lost(rank, "died", f"its process died ({error})")
                elif error is not None and failure is None:
                    failure, failed_at = (rank, error), time.monotonic()
                    self.record.members[rank].state = "failed"
                elif error is None:
                    heard[rank] = time.monotonic()
                    self.record.members[rank].last_heartbeat = time.time()
                    if pinged:
                        self.record.members[rank].heartbeats += 1
                    if rank not in runs.values():
                        self.record.members[rank].state = "finished"
            now = time.monotonic()
            for rank in runs.values():
                if now - heard[rank] > resources.hang_timeout_s:
                    self._lost(rank, "hung", f"it answered no heartbeat for {now - heard[rank]:.0f} s")
            # A silent member is named by the heartbeat rule above; the gang is stalled only while every member answers.
            answering = all(now - heard[rank] < resources.hang_timeout_s / 2 for rank in runs.values())
            stalled = advancing.stalled(now) if runs and failure is None and answering else None
            if stalled is not None:
                self._stalled(stalled)
            if failure is not None and (now - failed_at > DEATH_GRACE_S or not runs):
                self._raise_failure(*failure)
        self.record.state = "finished"

    def _lost(self, rank: int, state: str, why: str) -> None:
        member = self.record.members[rank]
        member.state = state
        message = (
            f"{self.launch.label}: gang member {rank} of {len(self.actors)} (pid {member.pid} on {member.ip}) {state}: "
            f"{why}; the gang is torn down and the attempt retried as a new gang from the latest checkpoint"
        )
        self.record.state, self.record.message = "failed", message
        raise GangMemberLostError(message)

    def _stalled(self, why: str) -> None:
        for member in self.record.members:
            if member.state == "running":
                member.state = "stalled"
        message = (f"{self.launch.label}: the gang of {len(self.actors)} hosts is hung: {why}; it is torn down and the "
                   "attempt retried as a new gang from the latest checkpoint")  # fmt: skip
        self.record.state, self.record.message = "failed", message
        raise GangMemberLostError(message)

    def _raise_failure(self, rank: int, error: BaseException) -> None:
        cause = getattr(error, "cause", None)
        original = cause if isinstance(cause, Exception) else error
        note = f"raised in gang member {rank} of {len(self.actors)} of {self.launch.label}"
        self.record.state, self.record.message = "failed", f"{note}: {type(original).__name__}: {original}"
        original.add_note(note)
        raise original

    def tear_down(self) -> None:
        """Kill every member, remove the placement group, and make sure no member's process survives."""
        ray = self._ray
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        for group in self.groups:
            ray.util.remove_placement_group(group)
        self._wait_gone()
        for member in self.record.members:
            if member.state in ("starting", "running"):
                member.state = "torn down"
        if self.record.state == "running":
            self.record.state = "failed"
        self._write()

    def _wait_gone(self) -> None:
        """Wait until the members' processes on this node are gone; SIGKILL what outlives the timeout."""
        here = self._ray.get_runtime_context().get_node_id()
        local = [(m.pid, m.started) for m in self.record.members if m.pid is not None and m.node_id == here]
        wait_gone(self.launch.label, local)

    def _write(self) -> None:
        storage.write_json_atomic(storage.join(self.launch.output_path, GANG_FILE), dataclasses.asdict(self.record))


def _result_of(ray: Any, ref: Any) -> tuple[Any, BaseException | None]:
    try:
        return ray.get(ref), None
    except Exception as error:  # a member's failure, of any kind, is classified by the caller
        return None, error


def wait_gone(label: str, processes: list[tuple[int, int | None]], timeout_s: float = TEARDOWN_TIMEOUT_S) -> None:
    """Wait up to `timeout_s` until each (pid, start ticks) process is gone; SIGKILL those still running then,
    and wait for their exit too (a signal is delivered, not done). A pid that now names another process (the
    member exited and a later process got its pid) counts as gone and is never signalled."""

    def running(among: list[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
        return [(pid, start) for pid, start in among if is_running(pid, start)]

    deadline = time.monotonic() + timeout_s
    while (alive := running(processes)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in running(alive):
        logger.warning("%s: gang member process %d outlived ray.kill; killing it", label, pid)
        with contextlib.suppress(ProcessLookupError):  # it went between the look and the kill
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while (alive := running(alive)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in alive:
        logger.error("%s: gang member process %d is still alive %.0f s after SIGKILL", label, pid, KILL_WAIT_S)
