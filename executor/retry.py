"""Which failures are transient, and retrying them with bounded exponential backoff.

Transient: a lost worker or node, a lost object, preemption, a dropped connection, a timeout, a
storage 429 or 5xx. Those are worth another attempt. Anything else is an application error: it
fails the step at once, unless the step opts in with `RetryPolicy(retry_on=(SomeError,))`. That
includes a missing file, a denied permission (an expired token is not fixed by waiting) and a
storage 4xx: retrying them only delays the error the user has to fix. Classification walks the
exception's cause chain, so a storage error wrapped by a step's own exception (or translated by
s3fs into an `OSError` whose cause is the botocore error) still counts as transient.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_TRANSIENT_ERRNOS = {
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETRESET, errno.EAGAIN,
}  # fmt: skip
_TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}
# Ray's system failures (matched by name: ray is an optional dependency).
_RAY_TRANSIENT = {
    "WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OwnerDiedError", "ObjectFetchTimedOutError",
    "ObjectReconstructionFailedError", "ObjectReconstructionFailedMaxAttemptsExceededError",
    "ObjectReconstructionFailedLineageEvictedError", "ActorDiedError", "ActorUnavailableError",
    "RaySystemError", "LocalRayletDiedError", "TaskUnschedulableError", "OutOfMemoryError",
}  # fmt: skip
# Connection-level failures of the HTTP stacks under gcsfs and s3fs (botocore's `ClientError` is
# not one of them: it carries an HTTP status, classified below).
_NETWORK_ERROR_NAMES = {"ClientConnectionError", "ServerDisconnectedError", "ClientOSError",
                        "ClientPayloadError", "EndpointConnectionError", "ConnectionClosedError",
                        "ReadTimeoutError", "ConnectTimeoutError", "IncompleteRead", "ProtocolError"}  # fmt: skip


class TransientError(Exception):
    """Raise (or chain) this from a step to say "try again": e.g. a preemption notice."""


def _http_status(error: BaseException) -> int | None:
    for attribute in ("code", "status", "status_code"):
        value = getattr(error, attribute, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(error, "response", None)  # botocore ClientError
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


def _is_lost_upload_session(error: BaseException) -> bool:
    # gcsfs reports a resumable upload whose session the server (or a proxy) dropped as a 404, raised
    # as FileNotFoundError naming the session URL: the upload is redone by another attempt, the user's
    # file was never missing.
    return isinstance(error, FileNotFoundError) and "uploadType=resumable" in str(error)


def _is_transient_one(error: BaseException) -> bool:
    if isinstance(error, (TransientError, ConnectionError, TimeoutError)) or _is_lost_upload_session(error):
        return True
    name, module = type(error).__name__, type(error).__module__
    if module.startswith("ray") and name in _RAY_TRANSIENT:
        return True
    if name in _NETWORK_ERROR_NAMES and module.split(".")[0] in {"aiohttp", "botocore", "urllib3", "http"}:
        return True
    if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
        return True
    status = _http_status(error)
    return status in _TRANSIENT_HTTP if status is not None and module.split(".")[0] != "builtins" else False


def is_transient(error: BaseException) -> bool:
    """True if `error` or anything in its cause chain is a transient failure."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if _is_transient_one(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """How a step (or a storage call) is retried. Transient failures always qualify."""

    max_attempts: int = 3
    """Attempts in all, the first included."""
    initial_backoff_s: float = 1.0
    """Wait before the second attempt; each later wait is `multiplier` times longer."""
    multiplier: float = 2.0
    max_backoff_s: float = 60.0
    """No wait is longer than this."""
    retry_on: tuple[type[BaseException], ...] = ()
    """Application errors this step opts in to retrying (they are not retried otherwise)."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")

    def backoff_s(self, attempt: int) -> float:
        """The wait after failed attempt number `attempt` (1-based), with ±20% jitter."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return base * random.uniform(0.8, 1.2)

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        if attempt >= self.max_attempts:
            return False
        return is_transient(error) or (bool(self.retry_on) and isinstance(error, self.retry_on))


DEFAULT_RETRY = RetryPolicy()
"""For steps and shards that set no policy: transient failures only, 3 attempts per executor run."""

STORAGE_RETRY = RetryPolicy(max_attempts=6, initial_backoff_s=0.2, max_backoff_s=10.0)
"""For the executor's own metadata I/O; the fsspec clients retry inside each call as well."""


def call_with_retry[T](fn: Callable[[], T], what: str, policy: RetryPolicy = STORAGE_RETRY) -> T:
    """Call `fn`, retrying transient failures per `policy`; `what` names the operation in logs."""
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as error:
            if not policy.should_retry(error, attempt):
                raise
            wait = policy.backoff_s(attempt)
            logger.warning("%s: transient %s (%s); attempt %d, retrying in %.1fs",
                           what, type(error).__name__, error, attempt, wait)  # fmt: skip
            time.sleep(wait)
            attempt += 1
