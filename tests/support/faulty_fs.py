"""`faulty://<path>`: a real filesystem (local or s3) that raises injected faults while armed.

A fake store for fault tests, not a mock of our code: every call goes to the real filesystem
unless `FaultyFileSystem.fault` is set, in which case it raises a fresh exception from that
factory instead, the way a storage client does when the network or the service misbehaves.
The wrapped store is chosen per test with `FaultyFileSystem.target_protocol`; paths are the
target's paths ("/tmp/x" or "bucket/x") after `faulty://`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

import fsspec
from fsspec import AbstractFileSystem

from executor import storage


class FaultyFileSystem(AbstractFileSystem):
    protocol = "faulty"
    cachable = False
    target_protocol: ClassVar[str] = "file"
    """The real store behind `faulty://` (set by the test)."""
    fault: ClassVar[Callable[[], BaseException] | None] = None
    """While set, every call raises what this returns."""
    failures: ClassVar[int] = 0
    """Calls that raised an injected fault since the last `arm`."""
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.target = fsspec.filesystem(self.target_protocol)

    @classmethod
    def arm(cls, fault: Callable[[], BaseException] | None) -> None:
        with cls._lock:
            cls.fault, cls.failures = fault, 0

    def _maybe_fail(self) -> None:
        with self._lock:
            fault = FaultyFileSystem.fault
            if fault is None:
                return
            FaultyFileSystem.failures += 1
        raise fault()

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        self._maybe_fail()
        return self.target.ls(path, detail=detail, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict:
        self._maybe_fail()
        return self.target.info(path, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        self._maybe_fail()
        return self.target.cat_file(path, start=start, end=end, **kwargs)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self._maybe_fail()
        if self.target_protocol != "file":
            self.target.pipe_file(path, value, mode=mode, **kwargs)
        elif mode == "create":  # local files: the same atomic writes as the executor's own
            if not storage.create_exclusive(path, value):
                raise FileExistsError(path)
        else:
            storage.write_atomic(path, value)

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        self._maybe_fail()
        self.target.rm(path, recursive=recursive, maxdepth=maxdepth)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
