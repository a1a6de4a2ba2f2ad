"""`<output>/logs/step.log`: the log records of one step's thread, uploaded while it runs and at its end.

A step that fails because storage failed (a full disk, a store refusing writes) must still end FAILED with
its log somewhere: writing the traceback or uploading the log never raises here. A log that cannot be
uploaded whole stays on this machine; the store gets its last `TAIL_BYTES` and the traceback instead (a
small write may still fit), and `save_failure` returns a note saying where the whole log is, for the
FAILED message.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import traceback

from executor.store import storage
from executor.store.layout import LOG_FILE

logger = logging.getLogger(__name__)

TAIL_BYTES = 32 * 1024
"""What is uploaded of a log that cannot be uploaded whole: its end, where the failure is."""


class StepLog:
    """Captures log records from the step's thread into `<output>/logs/step.log` (or `<output>/<log_file>`;
    with `all_threads`, every thread's records: a gang member's process runs one step only)."""

    def __init__(self, output_path: str, log_file: str = LOG_FILE, all_threads: bool = False):
        self.target = storage.join(output_path, log_file)
        self._thread_id = None if all_threads else threading.get_ident()
        handle, self._local = tempfile.mkstemp(prefix="executor-step-", suffix=".log")
        os.close(handle)
        existing = storage.read_bytes(self.target)  # keep earlier attempts' logs
        if existing:
            with open(self._local, "wb") as out:
                out.write(existing)
        self._handler = logging.FileHandler(self._local, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        if self._thread_id is not None:
            self._handler.addFilter(lambda record: record.thread == self._thread_id)
        self._upload_lock = threading.Lock()

    def __enter__(self) -> StepLog:
        logging.getLogger().addHandler(self._handler)
        return self

    def reattach(self) -> None:
        """Put the handler back on the root logger if something removed it (Levanter's logging setup clears
        the root logger's handlers when its trainer starts)."""
        root = logging.getLogger()
        if self._handler not in root.handlers:
            root.addHandler(self._handler)

    def save_failure(self, error: BaseException) -> str | None:
        """Append `error`'s traceback and upload the log; None if both worked, else a note saying where the
        whole log is (the caller adds it to the FAILED message)."""
        trace = "".join(traceback.format_exception(error))
        self._handler.acquire()
        try:
            self._handler.flush()
            with open(self._local, "a", encoding="utf-8") as out:
                out.write(trace)
        except OSError as write_error:  # the local disk is full too: the traceback still goes into the tail
            logger.error("%s: could not add the traceback to %s (%s)", self.target, self._local, write_error)
        finally:
            self._handler.release()
        note = self._try_upload()
        if note is not None:
            self._upload_tail(note, trace)
        return note

    def _upload_tail(self, note: str, trace: str) -> None:
        with open(self._local, "rb") as local:
            local.seek(max(0, os.path.getsize(self._local) - TAIL_BYTES))
            tail = local.read()
        header = f"[{note}; its last {len(tail)} bytes follow]\n".encode()
        try:
            storage.write_atomic(self.target, header + tail + b"\n" + trace.encode())
        except OSError as error:
            logger.error("%s: could not store the end of the step's log either (%s)", self.target, error)

    def upload(self) -> None:
        with self._upload_lock:
            self._handler.flush()
            storage.upload_file(self._local, self.target)

    def _try_upload(self) -> str | None:
        try:
            self.upload()
        except OSError as error:
            note = f"the step's log could not be stored at {self.target} ({error}); it is kept at {self._local}"
            logger.error("%s", note)
            return note
        return None

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger().removeHandler(self._handler)
        uploaded = self._try_upload() is None
        try:
            self._handler.close()
        except OSError as error:  # flushing the last records to a full disk: what was uploaded stands
            logger.error("%s: could not close %s (%s)", self.target, self._local, error)
        if uploaded:
            os.unlink(self._local)
