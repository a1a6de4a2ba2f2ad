"""The executor's exception types. Each message names the step and says what to do."""

from __future__ import annotations


class ExecutorError(Exception):
    """Base class of every error the executor raises on purpose."""


class ConfigError(ExecutorError, ValueError):
    """A step or DAG is declared wrongly (bad name, non-dataclass config, duplicate step...)."""


class CycleError(ConfigError):
    """The DAG has a cycle; the message lists it."""


class UnversionableValueError(ExecutorError, TypeError):
    """A versioned value holds something that has no canonical JSON form."""


class StepFailedError(ExecutorError, RuntimeError):
    """One or more steps failed; `failed` and `dep_failed` name them, `output_paths` maps the failed steps
    that ran in this run (label -> output path) so the command line can show what they raised."""

    def __init__(
        self,
        message: str,
        failed: list[str] | None = None,
        dep_failed: list[str] | None = None,
        output_paths: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.failed = failed or []
        self.dep_failed = dep_failed or []
        self.output_paths = output_paths or {}


class LeaseLostError(ExecutorError):
    """Another worker took over this step's lease; this worker must stop working on it."""


class StorageError(ExecutorError, OSError):
    """A read or write of executor metadata failed or found corrupt data."""
