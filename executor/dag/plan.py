"""From the steps a user wrote to a plan: every step's version, hash, output path and resolved config.

Planning reads no storage (it only reads step functions' source files for code fingerprints). It
walks the DAG once, post-order and iteratively (chains of any depth), so a DAG of N steps and E edges
costs O(N + E):

1. collect every step reachable through `InputName`s or bare `ExecutorStep`s in configs (blocking or
   not) and reject cycles;
2. for each step, after its dependencies: build the version dict, hash it, merge it with an
   identical step built separately (their settings must agree), and pick its output path;
3. resolve the config: `versioned(v)` -> v, `InputName` (or a bare step) -> the dependency's path,
   a relative hard-coded `InputName` -> that path under the prefix, `OutputName` -> the step's own path;
   then let the config refuse its own settings (`check_settings()`, e.g. a train step's learning rate).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.dag.identity import (
    Marker,
    canonical_json,
    code_fingerprint,
    encode_value,
    function_name,
    hash_version,
    map_config,
    reference_problem,
    walk_config,
)
from executor.dag.spec import ExecutorStep, InputName, OutputName, ResourceConfig, StepFunction, VersionedValue
from executor.errors import ConfigError, CycleError
from executor.retry import DEFAULT_RETRY
from executor.store import storage
from executor.store.layout import HASH_CHARS

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class PlannedStep:
    """A step with its identity settled. Compared by identity; one per distinct (name, hash)."""

    step: ExecutorStep
    version: dict[str, Any]
    version_str: str
    hash: str
    """Full sha256 hex of the version; the path uses its first HASH_CHARS characters."""
    output_path: str
    fn_name: str
    fingerprint: str | None
    dependencies: list[PlannedStep]
    """Every dependency (blocking or not), in version order (sorted by hash)."""
    blocking: list[PlannedStep]
    """The dependencies that must succeed before this step runs."""
    config: Any = None
    """The config with every marker resolved; what `fn` receives."""
    dependents: list[PlannedStep] = field(default_factory=list)
    """Steps that block on this one."""

    @property
    def name(self) -> str:
        return self.step.name

    @property
    def short_hash(self) -> str:
        return self.hash[:HASH_CHARS]

    @property
    def label(self) -> str:
        """`name-hash`, the last part of the default output path."""
        return f"{self.name}-{self.short_hash}"


@dataclass
class Plan:
    steps: list[PlannedStep]
    """Every distinct step reachable from the requested ones, dependencies first."""
    requested: list[PlannedStep]
    """The distinct steps the caller passed, in their order."""
    by_step: dict[ExecutorStep, PlannedStep]
    """Every step object seen (duplicates too) to its planned step."""

    def lookup(self, step: ExecutorStep) -> PlannedStep:
        return self.by_step[step]


def _dependency_steps(markers: Iterable[tuple[str, Marker]]) -> list[ExecutorStep]:
    seen: dict[int, ExecutorStep] = {}
    for _key, marker in markers:
        if isinstance(marker, InputName) and marker.step is not None:
            seen.setdefault(id(marker.step), marker.step)
    return list(seen.values())


def requested_steps(steps: Sequence[ExecutorStep | InputName]) -> list[ExecutorStep]:
    """The steps a caller asked for; an `InputName` stands for its step, as in Marin's `executor_main`."""
    found = []
    for step in steps:
        if isinstance(step, InputName):
            if step.step is None:
                raise ConfigError(
                    f"hard-coded input {step.name!r} is not a step and cannot be run; "
                    "pass steps or output_path_of(step)"
                )
            step = step.step
        if not isinstance(step, ExecutorStep):
            raise ConfigError(f"expected ExecutorStep objects, got {type(step).__name__}: {step!r}")
        found.append(step)
    return found


def build_plan(to_plan: Sequence[ExecutorStep | InputName], prefix: str) -> Plan:
    """Plan `to_plan` and everything it depends on, with outputs under `prefix`."""
    steps = requested_steps(to_plan)
    planner = _Planner(prefix)
    # Planning allocates many small, long-lived objects; the cyclic GC would rescan them all
    # again and again (superlinear on 10^4-step DAGs), and everything made here stays alive in the plan.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for root in steps:
            planner.visit(root)
    finally:
        if gc_was_enabled:
            gc.enable()
    requested = list(dict.fromkeys(planner.by_step[step] for step in steps))  # ordered, distinct
    return Plan(steps=planner.order, requested=requested, by_step=planner.by_step)


class _Planner:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.by_step: dict[ExecutorStep, PlannedStep] = {}
        self.by_identity: dict[tuple[str, str], PlannedStep] = {}
        self.by_path: dict[str, PlannedStep] = {}
        self.order: list[PlannedStep] = []
        self._markers: dict[ExecutorStep, list[tuple[str, Marker]]] = {}

    def markers(self, step: ExecutorStep) -> list[tuple[str, Marker]]:
        found = self._markers.get(step)
        if found is None:
            found = self._markers[step] = list(walk_config(step.config))
        return found

    def visit(self, root: ExecutorStep) -> None:
        if root in self.by_step:
            return
        on_path: dict[ExecutorStep, int] = {root: 0}
        stack = [(root, iter(_dependency_steps(self.markers(root))))]
        while stack:
            node, pending = stack[-1]
            child = next(pending, None)
            if child is None:
                stack.pop()
                del on_path[node]
                self.finish(node)
            elif child in on_path:
                cycle = [entry[0].name for entry in stack[on_path[child] :]] + [child.name]
                raise CycleError(f"the DAG has a cycle: {' -> '.join(cycle)}; a step cannot depend on itself")
            elif child not in self.by_step:
                on_path[child] = len(stack)
                stack.append((child, iter(_dependency_steps(self.markers(child)))))

    def finish(self, step: ExecutorStep) -> None:
        found: dict[PlannedStep, None] = {}  # ordered sets: wide fan-in stays linear
        blocking_found: dict[PlannedStep, None] = {}
        for _key, marker in self.markers(step):
            if not isinstance(marker, InputName) or marker.step is None:
                continue
            planned = self.by_step[marker.step]
            found[planned] = None
            if marker.block_on_step:
                blocking_found[planned] = None
        dependencies = sorted(found, key=lambda dep: (dep.hash, dep.name))
        blocking = list(blocking_found)
        version = self.version_of(step, dependencies)
        version_str, full_hash = hash_version(version)
        fn_name, fingerprint = function_name(step.function), code_fingerprint(step.function)
        if isinstance(step.fn, StepFunction) and (problem := reference_problem(step.fn)):
            raise ConfigError(f"step {step.name!r} (defined at {step.defined_at}): {problem}")

        existing = self.by_identity.get((step.name, full_hash))
        if existing is not None:
            if existing.fn_name != fn_name or existing.fingerprint != fingerprint:
                raise ConfigError(
                    f"two steps named {step.name!r} have the same version (hash {full_hash[:HASH_CHARS]}, "
                    f"path {existing.output_path}) but different functions ({existing.fn_name} vs {fn_name}"
                    f"{', different source' if existing.fn_name == fn_name else ''}): they would write one "
                    f"path; rename one of them or give it a code_version (defined at {existing.step.defined_at} "
                    f"and {step.defined_at})"
                )
            _check_same_settings(existing, step)
            self.by_step[step] = existing
            return

        output_path = self.output_path_for(step, full_hash)
        clash = self.by_path.get(output_path)
        if clash is not None:
            raise ConfigError(
                f"steps {clash.label} and {step.name}-{full_hash[:HASH_CHARS]} would both write {output_path}; "
                "give them different override_output_path values"
            )
        planned = PlannedStep(
            step=step,
            version=version,
            version_str=version_str,
            hash=full_hash,
            output_path=output_path,
            fn_name=fn_name,
            fingerprint=fingerprint,
            dependencies=dependencies,
            blocking=blocking,
        )
        planned.config = map_config(step.config, lambda marker: self.resolve(marker, planned))
        _check_settings(planned)
        for dependency in blocking:
            dependency.dependents.append(planned)
        self.by_step[step] = planned
        self.by_identity[(step.name, full_hash)] = planned
        self.by_path[output_path] = planned
        self.order.append(planned)

    def version_of(self, step: ExecutorStep, dependencies: list[PlannedStep]) -> dict[str, Any]:
        index = {id(dep): position for position, dep in enumerate(dependencies)}
        markers = self.markers(step)
        if any(".{" in key or key.startswith("{") for key, _m in markers):  # sets: order by content
            markers = list(walk_config(step.config, set_order=lambda m: self.marker_order(m, step)))
        config: dict[str, Any] = {}
        for key, marker in markers:
            if isinstance(marker, VersionedValue):
                config[key] = encode_value(marker.value, f"step {step.name!r}, config key {key!r}")
            elif isinstance(marker, InputName):
                if marker.step is None:
                    config[key] = marker.name
                else:
                    position = index[id(self.by_step[marker.step])]
                    config[key] = f"DEP[{position}]" + (f"/{marker.name}" if marker.name else "")
        return {
            "name": step.name,
            "config": config,
            "dependencies": [f"{dep.name}-{dep.hash}" for dep in dependencies],
            "code_version": step.code_version,
        }

    def marker_order(self, marker: Marker, step: ExecutorStep) -> str:
        if isinstance(marker, VersionedValue):
            return "v" + canonical_json(encode_value(marker.value, f"step {step.name!r}, set member"))
        if isinstance(marker, InputName):
            dep = self.by_step[marker.step].hash if marker.step is not None else ""
            return f"i{dep}/{marker.name or ''}"
        return f"o{marker.name or ''}"

    def output_path_for(self, step: ExecutorStep, full_hash: str) -> str:
        override = step.override_output_path
        if override is None:
            return storage.join(self.prefix, f"{step.name}-{full_hash[:HASH_CHARS]}")
        if storage.is_url(override) or override.startswith("/"):
            return storage.make_absolute(override)
        return storage.join(self.prefix, override)

    def resolve(self, marker: Marker, planned: PlannedStep) -> Any:
        if isinstance(marker, VersionedValue):
            return marker.value
        if isinstance(marker, OutputName):
            return storage.join(planned.output_path, marker.name) if marker.name else planned.output_path
        if marker.step is None:  # hard-coded: relative means under the prefix, whatever the worker's cwd
            assert marker.name is not None
            if storage.is_url(marker.name) or marker.name.startswith("/"):
                return marker.name
            return storage.join(self.prefix, marker.name)
        base = self.by_step[marker.step].output_path
        return storage.join(base, marker.name) if marker.name else base


def _check_settings(planned: PlannedStep) -> None:
    """A config may refuse its own settings before anything runs: `check_settings()` raising ValueError (a train
    step's non-positive steps or learning rate). Called on the resolved config, so it sees the values run with."""
    check = getattr(planned.config, "check_settings", None)
    if not callable(check):
        return
    try:
        check()
    except ValueError as error:
        raise ConfigError(
            f"step {planned.name} (hash {planned.short_hash}, path {planned.output_path}, defined at "
            f"{planned.step.defined_at}): {error}; fix the step's config"
        ) from error


_MERGED_SETTINGS = ("override_output_path", "resources", "retry", "description")
"""What two definitions of one step (same name and version) must agree on to be merged."""


def _settings(step: ExecutorStep) -> dict[str, Any]:
    # Leaving a setting out means its default, so `None` and the default agree.
    settings = {name: getattr(step, name) for name in _MERGED_SETTINGS}
    settings["resources"] = step.resources or ResourceConfig()
    settings["retry"] = step.retry or DEFAULT_RETRY
    return settings


def _check_same_settings(existing: PlannedStep, step: ExecutorStep) -> None:
    """Merging steps whose settings differ would keep whichever came first: refuse instead."""
    kept, other = _settings(existing.step), _settings(step)
    conflicts = [name for name in _MERGED_SETTINGS if kept[name] != other[name]]
    if conflicts:
        differences = "; ".join(f"{name}: {kept[name]!r} vs {other[name]!r}" for name in conflicts)
        raise ConfigError(
            f"step {step.name!r} (hash {existing.short_hash}, path {existing.output_path}) is defined twice with "
            f"the same version but different settings ({differences}): defined at {existing.step.defined_at} "
            f"and at {step.defined_at}. Make the settings agree, or give one a different name or code_version"
        )
