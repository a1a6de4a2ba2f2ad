"""Local stand-ins for cloud storage, started by the tests themselves, all on 127.0.0.1.

- `gcs_emulator`: `gcp-storage-emulator` (in memory), used through the real gcsfs and tensorstore, with
  the two GCS behaviours tensorstore needs that it lacks added (tests/support/gcs_emulator.py). It ignores
  `ifGenerationMatch` preconditions, so exclusive-create semantics are proven on S3 and local files.
- `s3_server`: `moto_server`, used through the real s3fs; it enforces `If-None-Match: *`, atomically as S3
  does once tests/support/moto_s3_server.py serializes its object writes (moto alone checks, then writes).
- `FaultProxy`: an HTTP proxy in front of the emulator that fails a fraction of requests with
  503 or 429, drops connections before forwarding, or forwards and then drops the answer (the
  nastiest case: the write happened, the client does not know).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

# Must be set before gcsfs is imported anywhere, or every bucket call waits 60 s+ for a metadata probe.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

BUCKET = "executor-test"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not open port {port} within {timeout_s}s")


def use_gcs_endpoint(url: str) -> None:
    """Point gcsfs at `url` (the emulator or a proxy in front of it) for instances made from now on."""
    import gcsfs

    os.environ["STORAGE_EMULATOR_HOST"] = url
    os.environ["FSSPEC_GS_TOKEN"] = "anon"
    gcsfs.GCSFileSystem.clear_instance_cache()


@contextlib.contextmanager
def running_gcs_emulator() -> Iterator[str]:
    """Start a GCS emulator with one bucket and point gcsfs at it; yields `gs://<bucket>`."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "gcs_emulator.py"), "--port", str(port),
         "--bucket", BUCKET],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, process, "gcp-storage-emulator")
        os.environ["EXECUTOR_TEST_GCS_URL"] = f"http://127.0.0.1:{port}"
        use_gcs_endpoint(f"http://127.0.0.1:{port}")
        yield f"gs://{BUCKET}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[str]:
    """A bucket on a GCS emulator; yields `gs://<bucket>`."""
    with running_gcs_emulator() as bucket:
        yield bucket


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A bucket on moto_server; yields `s3://<bucket>`."""
    port = free_port()
    server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moto_s3_server.py")  # S3's atomic creates
    process = subprocess.Popen(
        [sys.executable, server, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, process, "moto_server")
        import s3fs

        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }.items():  # fmt: skip
            os.environ[name] = value
        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem(client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"}).mkdir(BUCKET)
        yield f"s3://{BUCKET}"
    finally:
        process.terminate()
        process.wait(timeout=30)


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # clients open many connections at once


class FaultProxy:
    """Forward HTTP to `upstream`, failing a fraction `fail_rate` of requests in assorted ways,
    and optionally delaying each by `latency_s` (an object store's round trip)."""

    def __init__(self, upstream_port: int, fail_rate: float, seed: int = 0, latency_s: float = 0.0):
        self.upstream_port = upstream_port
        self.fail_rate = fail_rate
        self.latency_s = latency_s
        """Added to every request, to stand in for a real store's round trip."""
        # The emulator serves one connection at a time with a listen backlog of 5: concurrent
        # connections overflow it and stall for a TCP retransmit. Forward one request at a time.
        self.upstream_lock = threading.Lock()
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.faults: Counter[str] = Counter()
        self.server = _ProxyServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def pick_fault(self) -> str:
        with self.lock:
            draw = self.random.random()
            self.faults["requests"] += 1
        if draw >= self.fail_rate:
            return "none"
        fault = ("503", "429", "drop_before", "drop_after")[int(draw / self.fail_rate * 4)]
        with self.lock:
            self.faults[fault] += 1
        return fault

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.latency_s:
                    time.sleep(proxy.latency_s)
                fault = proxy.pick_fault()
                if fault in ("503", "429"):
                    self.send_response(int(fault))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if fault == "drop_before":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                with proxy.upstream_lock:
                    upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    payload = response.read()
                    upstream.close()
                if fault == "drop_after":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def do_GET(self) -> None:
                self._relay()

            def do_HEAD(self) -> None:
                self._relay()

            def do_POST(self) -> None:
                self._relay()

            def do_PUT(self) -> None:
                self._relay()

            def do_PATCH(self) -> None:
                self._relay()

            def do_DELETE(self) -> None:
                self._relay()

        return Handler
