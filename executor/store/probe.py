"""One look at a command-line target on an object store before anything else reads it, bounded in time.

`python -m executor status gs://no-such-bucket/runs` offline used to spend 48 s in the storage layer's retries
(right for a run, where a dropped connection heals) and end in 150 lines of gcsfs and aiohttp tracebacks. A
person at a terminal wants one line, soon. So each object-store target is first looked up once, without the
executor's retries, in a thread given `PROBE_TIMEOUT_S`; what goes wrong is said in one line naming the path
and the likely cause:

- no answer in time, a refused connection, an unknown host: offline, or the store's endpoint is unreachable;
- no credentials, or credentials the store refuses (401/403): which to set up;
- nothing at the path: no such bucket or prefix.

Local paths are checked with a plain `exists`.
"""

from __future__ import annotations

import threading
from typing import Any

from executor.store import storage

PROBE_TIMEOUT_S = 12.0
"""How long a command-line target on an object store may take to answer its first lookup: with the start of
Python and its imports, the command has said what is wrong within 15 s."""

_OFFLINE = ("ClientConnectorError", "ServerDisconnectedError", "gaierror", "ConnectionError", "ConnectTimeout",
            "EndpointConnectionError", "TimeoutError", "ConnectionRefusedError")  # fmt: skip
_NO_CREDENTIALS = ("DefaultCredentialsError", "RefreshError", "NoCredentialsError", "PartialCredentialsError",
                   "TransportError", "PermissionError")  # fmt: skip


class StoreUnreachableError(OSError):
    """A target's store did not answer, refused the credentials, or holds nothing there; one line."""


def probe(target: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether `target` exists; StoreUnreachableError (one line, with the likely cause) if its store cannot say
    within `timeout_s`."""
    if not storage.is_url(target) or storage.on_local_disk(target):
        return storage.exists(target)
    answer: dict[str, Any] = {}

    def look() -> None:
        try:
            fs, fs_path = storage.filesystem(target)
            answer["exists"] = fs.exists(fs_path)
        except BaseException as error:  # handed to the caller's thread, which says what it means
            answer["error"] = error

    thread = threading.Thread(target=look, name="store-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise StoreUnreachableError(
            f"{target}: no answer from its store within {timeout_s:.0f} s: offline, or the store's endpoint is "
            "unreachable (check the network, a proxy, STORAGE_EMULATOR_HOST / AWS_ENDPOINT_URL)"
        )
    if "error" in answer:
        raise StoreUnreachableError(explain_store_error(target, answer["error"])) from answer["error"]
    return bool(answer["exists"])


def explain_store_error(target: str, error: BaseException) -> str:
    """One line: the path, the likely cause, and the error's own last words."""
    chain = _chain(error)
    names = {type(link).__name__ for link in chain}
    text = " ".join(str(link) for link in chain)
    last = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
    if names & set(_OFFLINE) or "Cannot connect" in text or "Name or service not known" in text:
        return f"{target}: cannot reach its store: offline, or the endpoint is unreachable ({last})"
    if names & set(_NO_CREDENTIALS) or any(code in text for code in ("401", "403", "credentials", "Forbidden")):
        return (
            f"{target}: the store refused access: no credentials, or ones that may not read this path (gs://: "
            f"`gcloud auth application-default login`; s3://: AWS_PROFILE or AWS_ACCESS_KEY_ID) ({last})"
        )
    if names & {"FileNotFoundError", "NoSuchBucket"} or "404" in text or "does not exist" in text:
        return f"{target}: no such bucket or path ({last})"
    return f"{target}: the store failed ({last})"


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain
