"""What a user writes to declare a step: `ExecutorStep` and the markers its config may hold.

A config is a frozen dataclass whose fields are plain values (not hashed), `versioned(v)`
(hashed), `output_path_of(step, sub)` / `InputName` / a bare `ExecutorStep` (a dependency: its
version is hashed, its output path is filled in before the step runs) or `this_output_path(sub)`
(the step's own output path, filled in at run time). Nothing here touches storage; identity lives
in `identity.py` and `plan.py`.
"""

from __future__ import annotations

import dataclasses
import importlib
import posixpath
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from executor.errors import ConfigError
from executor.retry import RetryPolicy

_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)*$")


@dataclass(frozen=True)
class ResourceConfig:
    """What a step asks of the machine that runs it. Never part of the step's identity."""

    cpus: float | None = None
    """CPU cores for the step's own process or task. Default: 1, or 0 for accelerator steps, so that
    accelerator nodes (which declare no CPUs to keep CPU work off them) can take them."""
    memory_gb: float | None = None
    """Memory in GiB; None leaves it to the backend."""
    gpus: float = 0
    """GPUs (or other accelerators) for the step."""
    accelerator_type: str | None = None
    """E.g. "H100" or "v5p-8"; backends that know accelerator types schedule on it."""
    custom: dict[str, float] = field(default_factory=dict)
    """Extra named resources (Ray custom resources), e.g. {"TPU": 4} for the chips of one TPU host."""
    hosts: int = 1
    """Hosts (one JAX process each) the step spans. Above 1 the step runs as a gang (executor/run/gang.py): one
    Ray task per host, each asking for the resources above, joined by `jax.distributed`."""
    cpu_devices_per_host: int | None = None
    """Stand-in hosts on one machine: each gang member gets this many fake CPU JAX devices and gloo
    collectives, and the members are packed onto one node. A one-host step gets them too (a gang's reference
    on the same global devices: executor/run/cpu_devices.py). None on real accelerators."""
    hang_timeout_s: float = 600.0
    """A gang member that answers no heartbeat for this long is hung, and so is a gang none of whose members has
    completed a step (`executor.progress.report`) for this long: the gang is torn down and the attempt fails as
    transient (the executor's retry starts a new gang)."""
    domain_label: str | None = None
    """The Ray node label whose value names a node's fast domain (an NVLink rack, a TPU slice), e.g.
    "ray.io/gpu-domain". With `hosts_per_domain`, a gang is placed that many hosts to a domain, ranks domain-major,
    so consecutive ranks (an expert-parallel group) never span two domains."""
    hosts_per_domain: int | None = None
    """Hosts of a gang inside one fast domain (with `domain_label`); `hosts` must be a multiple of it."""
    progress_timeout_s: float | None = None
    """How long a gang that reports progress may go without a completed step (None: `hang_timeout_s`); what runs
    between two steps outside a phase of its own (a checkpoint save and an eval have theirs) must fit in it."""
    first_step_timeout_s: float = 3600.0
    """How long a gang that reports progress may take to its first completed step (compiling)."""
    checkpoint_timeout_s: float = 1800.0
    """How long a gang member may spend in a checkpoint save (`progress.phase("checkpoint")`) without a step."""
    eval_timeout_s: float = 1800.0
    """How long a gang member may spend in an eval between two steps (`progress.phase("eval")`, the first of which
    compiles the eval's program) without a step. The train step's plan sets it from the eval's size."""

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ConfigError(f"ResourceConfig.hosts must be at least 1, got {self.hosts}")
        if self.cpu_devices_per_host is not None and self.cpu_devices_per_host < 1:
            raise ConfigError(
                f"ResourceConfig.cpu_devices_per_host must be at least 1, got {self.cpu_devices_per_host}"
            )
        if (self.domain_label is None) != (self.hosts_per_domain is None):
            raise ConfigError("ResourceConfig.domain_label and hosts_per_domain go together: set both or neither")
        if self.hosts_per_domain is not None and (self.hosts_per_domain < 1 or self.hosts % self.hosts_per_domain):
            raise ConfigError(f"ResourceConfig.hosts_per_domain={self.hosts_per_domain} must divide hosts={self.hosts}")
        if self.progress_timeout_s is not None and not self.progress_timeout_s > 0:
            raise ConfigError(f"ResourceConfig.progress_timeout_s must be positive, got {self.progress_timeout_s}")
        for name in ("hang_timeout_s", "first_step_timeout_s", "checkpoint_timeout_s", "eval_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"ResourceConfig.{name} must be positive, got {getattr(self, name)}")


_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class StepFunction:
    """A step's function named by reference, `"package.module:function"`, as an `ExecutorStep` may give it: the
    DAG's definition then imports none of the step's code (nor JAX, Levanter and the rest that it imports), and
    the process that runs the step imports it when it calls it. The executor names and fingerprints it from the
    module's file, without importing it (`identity.code_fingerprint`): the same name and fingerprint as the
    function itself gets."""

    reference: str

    def __post_init__(self) -> None:
        if not isinstance(self.reference, str) or not _REFERENCE.match(self.reference):
            raise ConfigError(f"step function {self.reference!r} is not a reference: write 'package.module:function'")

    @property
    def module(self) -> str:
        return self.reference.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.reference.split(":", 1)[1]

    def load(self) -> Callable[[Any], Any]:
        """The function itself, its module imported."""
        target: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            target = getattr(target, part, None)
            if target is None:
                raise ConfigError(f"step function {self.reference!r}: {self.module} has no {self.qualname}")
        if not callable(target):
            raise ConfigError(f"step function {self.reference!r} is a {type(target).__name__}, not a function")
        return target

    def __call__(self, config: Any) -> Any:
        return self.load()(config)


@dataclass(frozen=True, eq=False)
class ExecutorStep[ConfigT]:
    """One node of the DAG: `fn(config)` writes its outputs under the step's output path.

    Steps compare by identity; two steps built separately with the same name, function and
    version are merged into one when the DAG is planned.
    """

    name: str
    """Human name; the output path is `<prefix>/<name>-<hash>`. May contain `/` to group steps."""
    fn: Callable[[ConfigT], Any] | str
    """The function that does the work. It receives the config with every marker resolved. A string
    `"package.module:function"` names it without importing it: the step holds it as a `StepFunction`."""
    config: ConfigT
    """A dataclass instance (frozen is best) holding plain values and markers. If it has a `check_settings()`
    method, the planner calls it on the resolved config and turns a ValueError into a ConfigError naming the
    step, before any step runs."""
    description: str | None = None
    """Free text shown by `status`, `explain` and the dashboard."""
    override_output_path: str | None = None
    """Pin the output path: relative means under the prefix, absolute is used as is.
    It changes the path, never the version."""
    resources: ResourceConfig | None = None
    """What the step needs to run; never hashed."""
    code_version: str | None = None
    """Bump this string to force new outputs after a code change (code is not hashed)."""
    retry: RetryPolicy | None = None
    """How failures are retried; default (`retry.DEFAULT_RETRY`): transient ones only (lost node, dropped
    connection, timeout, storage 429/5xx), up to 3 attempts per executor run. Other exceptions (a missing
    file, a denied permission included) fail the step unless listed in `retry_on`."""
    defined_at: str = field(default="", init=False, repr=False)
    """`file:line` where the step was built (set automatically), named when two definitions conflict."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "defined_at", _caller_site())
        if not isinstance(self.name, str) or not _STEP_NAME.match(self.name):
            raise ConfigError(
                f"step name {self.name!r} is not valid: use letters, digits, '_', '-', '.', and '/' between parts"
            )
        if isinstance(self.fn, str):
            object.__setattr__(self, "fn", StepFunction(self.fn))
        if not callable(self.fn):
            raise ConfigError(f"step {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        if not dataclasses.is_dataclass(self.config) or isinstance(self.config, type):
            raise ConfigError(
                f"step {self.name!r}: config must be a dataclass instance, got "
                f"{type(self.config).__name__}; wrap the step's settings in a @dataclass(frozen=True)"
            )

    @property
    def function(self) -> Callable[[ConfigT], Any]:
        """`fn` as the step holds it: a `StepFunction` where it was given by reference."""
        assert not isinstance(self.fn, str), "ExecutorStep.__post_init__ holds a reference as a StepFunction"
        return self.fn

    def cd(self, name: str) -> InputName:
        """A dependency on the subpath `name` of this step's output."""
        return InputName(self, name)

    def __truediv__(self, name: str) -> InputName:
        return InputName(self, name)

    def __repr__(self) -> str:
        fn = self.fn.reference if isinstance(self.fn, StepFunction) else getattr(self.fn, "__qualname__", self.fn)
        return f"ExecutorStep(name={self.name!r}, fn={fn!r})"


@dataclass(frozen=True)
class InputName:
    """A path inside another step's output (or a hard-coded path), resolved before running.

    `block_on_step=False` makes a pseudo-dependency: its version enters the hash but the
    executor neither waits for it nor runs it (unless it is asked for or blocking-needed).
    """

    step: ExecutorStep | None
    name: str | None = None
    block_on_step: bool = True

    @staticmethod
    def hardcoded(path: str) -> InputName:
        """A fixed path, not produced by any step; the path itself enters the version."""
        return InputName(None, path)

    def nonblocking(self) -> InputName:
        return dataclasses.replace(self, block_on_step=False)

    def cd(self, name: str) -> InputName:
        return dataclasses.replace(self, name=join_relative(self.name, name))

    def __truediv__(self, name: str) -> InputName:
        return self.cd(name)

    def __post_init__(self) -> None:
        if self.step is None:
            if not self.name:
                raise ConfigError("InputName.hardcoded needs a non-empty path")
            # "raw/x/", "./raw/x" and "raw/x" are one input (and one version).
            normalized = self.name.rstrip("/") if "://" in self.name else posixpath.normpath(self.name)
            object.__setattr__(self, "name", normalized or self.name)
        elif self.name is not None:
            # A subpath names a place inside the step's output: "d/", "./d" and "/d" are "d", so they
            # are one dependency with one version.
            normalized = posixpath.normpath(self.name.strip("/")) if self.name.strip("/") else "."
            object.__setattr__(self, "name", None if normalized == "." else normalized)


@dataclass(frozen=True)
class OutputName:
    """The running step's own output path (or a subpath of it), filled in at run time."""

    name: str | None = None


@dataclass(frozen=True)
class VersionedValue:
    """A config value that enters the step's version (and so its hash and path)."""

    value: Any


# The marker constructors below are typed `Any` on purpose: a config's fields are annotated with
# what the step function receives (`input_path: str`), and a marker stands in for that value
# until the executor resolves it. At run time they return the marker types above.


def versioned(value: Any) -> Any:
    """Mark `value` as part of the step's identity (a `VersionedValue`). It must be JSON-canonical data."""
    _reject_markers(value, "versioned(...)")
    return VersionedValue(value)


def output_path_of(step: ExecutorStep, name: str | None = None) -> Any:
    """The output path of `step` (or a subpath): an `InputName`, a dependency whose version is hashed."""
    return InputName(step, name)


def this_output_path(name: str | None = None) -> Any:
    """The running step's own output path (or a subpath of it): an `OutputName`."""
    return OutputName(name)


THIS_OUTPUT_PATH: Any = OutputName(None)


def join_relative(base: str | None, name: str | None) -> str | None:
    if not name:
        return base
    if not base:
        return name
    return f"{base.rstrip('/')}/{name.lstrip('/')}"


def _caller_site() -> str:
    """`file:line` of the code that built a step: the first frame outside this module, the `__init__`
    that dataclasses generate and `dataclasses.replace`."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _is_construction_frame(frame.f_code):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _is_construction_frame(code: CodeType) -> bool:
    filename = code.co_filename
    generated_init = code.co_name == "__init__" and filename.startswith("<")
    return generated_init or filename == __file__ or filename == dataclasses.__file__


def _reject_markers(value: Any, where: str) -> None:
    """`versioned` holds data only: a dependency or another versioned value inside is an error."""
    if isinstance(value, VersionedValue):
        raise ValueError(f"{where}: the value is already versioned; do not nest versioned()")
    if isinstance(value, (InputName, ExecutorStep, OutputName)):
        raise ValueError(
            f"{where}: {type(value).__name__} cannot be versioned; a dependency's version is already part of the hash"
        )
    if isinstance(value, dict):
        for item in value.values():
            _reject_markers(item, where)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _reject_markers(item, where)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _reject_markers(getattr(value, f.name), where)
