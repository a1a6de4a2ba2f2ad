"""`<output>/logs/step.log`: the log records of one step's thread, uploaded while it runs and at its end."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import traceback

from executor import storage
from executor.status import LOG_FILE


class StepLog:
    """Captures log records from the step's thread into `<output>/logs/step.log`."""

    def __init__(self, output_path: str):
        self.target = storage.join(output_path, LOG_FILE)
        self._thread_id = threading.get_ident()
        handle, self._local = tempfile.mkstemp(prefix="executor-step-", suffix=".log")
        os.close(handle)
        existing = storage.read_bytes(self.target)  # keep earlier attempts' logs
        if existing:
            with open(self._local, "wb") as out:
                out.write(existing)
        self._handler = logging.FileHandler(self._local, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._handler.addFilter(lambda record: record.thread == self._thread_id)
        self._upload_lock = threading.Lock()

    def __enter__(self) -> StepLog:
        logging.getLogger().addHandler(self._handler)
        return self

    def write_exception(self, error: BaseException) -> None:
        self._handler.acquire()
        try:
            with open(self._local, "a", encoding="utf-8") as out:
                self._handler.flush()
                out.write("".join(traceback.format_exception(error)))
        finally:
            self._handler.release()

    def upload(self) -> None:
        with self._upload_lock:
            self._handler.flush()
            storage.upload_file(self._local, self.target)

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger().removeHandler(self._handler)
        try:
            self.upload()
        finally:
            self._handler.close()
            os.unlink(self._local)
