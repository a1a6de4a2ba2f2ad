"""Downloads from a local HTTP server (one that breaks mid-transfer) and from the GCS emulator."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fsspec
import pytest

from executor.shards.writer import ShardFailedError
from steps.data.download import DownloadConfig, download

FILES = {"a.jsonl": b'{"id": "a", "text": "alpha"}\n' * 2000, "sub/b.jsonl": b'{"id": "b", "text": "beta"}\n' * 3000,
         "skip.txt": b"not wanted"}  # fmt: skip


class FlakyServer:
    """Serves FILES with Range support; the first GET of each name in `break_once` dies halfway."""

    def __init__(self, break_once: set[str], sums: dict[str, str] | None = None):
        self.files = dict(FILES)
        if sums is not None:
            self.files["SHA256SUMS"] = "".join(f"{digest}  {name}\n" for name, digest in sums.items()).encode()
        self.break_once = set(break_once)
        self.ranges: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                name = self.path.lstrip("/")
                if name not in server.files:
                    self.send_error(404)
                    return
                body = server.files[name]
                start = 0
                if self.headers.get("Range"):
                    server.ranges.append(f"{name}:{self.headers['Range']}")
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if name in server.break_once:
                    server.break_once.discard(name)
                    self.wfile.write(body[start : start + len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


def manifest(output: str) -> dict[str, dict]:
    return {entry["path"]: entry for entry in json.loads(open(f"{output}/manifest.json").read())}


def test_http_download_resumes_a_broken_transfer_and_verifies_checksums(tmp_path):
    sums = {name: hashlib.sha256(body).hexdigest() for name, body in FILES.items()}
    server = FlakyServer(break_once={"sub/b.jsonl"}, sums=sums)
    try:
        output = str(tmp_path / "out")
        download(DownloadConfig(source=server.url, files=["a.jsonl", "sub/b.jsonl", "skip.txt"],
                                include=["*.jsonl"], output_path=output))  # fmt: skip
    finally:
        server.close()
    assert (tmp_path / "out/files/sub/b.jsonl").read_bytes() == FILES["sub/b.jsonl"]
    assert not (tmp_path / "out/files/skip.txt").exists()
    assert server.ranges == [f"sub/b.jsonl:bytes={len(FILES['sub/b.jsonl']) // 2}-"]
    entries = manifest(output)
    assert entries["files/a.jsonl"]["sha256"] == sums["a.jsonl"]
    assert entries["files/sub/b.jsonl"]["verified"] == ["sha256"]
    stats = json.loads((tmp_path / "out/stats.json").read_text())
    assert stats["files"] == 2 and stats["files_verified_against_source"] == 2 and stats["files_resumed"] == 1


def test_a_checksum_mismatch_fails_the_file(tmp_path):
    server = FlakyServer(break_once=set(), sums={"a.jsonl": "0" * 64})
    try:
        with pytest.raises(ShardFailedError, match="sha256"):
            download(DownloadConfig(source=server.url, files=["a.jsonl"], output_path=str(tmp_path / "out")))
    finally:
        server.close()


def test_a_source_whose_server_is_down_names_the_cause_and_the_remedy(tmp_path):
    """Connection refused (nothing listens on the port): the shard fails naming the URL, the cause and what to do,
    not "transfer broke after 0 bytes"."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ShardFailedError, match=rf"http://127.0.0.1:{port}/a.jsonl: connection refused: nothing "
                                               rf"listens at 127.0.0.1:{port}; check the source URL"):  # fmt: skip
        download(DownloadConfig(source=f"http://127.0.0.1:{port}", files=["a.jsonl"],
                                output_path=str(tmp_path / "out")))  # fmt: skip


def test_a_missing_source_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        download(DownloadConfig(source=str(tmp_path / "nowhere"), output_path=str(tmp_path / "out")))


@pytest.mark.parametrize("store", [pytest.param("gcs_emulator", marks=pytest.mark.gcs),
                                   pytest.param("s3_server", marks=pytest.mark.s3)])  # fmt: skip
def test_download_from_object_stores_records_their_published_checksums(store, request, tmp_path):
    source = f"{request.getfixturevalue(store)}/download-source"
    fs, _ = fsspec.core.url_to_fs(source)
    for name, body in FILES.items():
        with fs.open(f"{source}/{name}", "wb") as handle:
            handle.write(body)
    output = str(tmp_path / "out")
    download(DownloadConfig(source=source, include=["*.jsonl", "sub/*"], output_path=output))
    entries = manifest(output)
    assert sorted(entries) == ["files/a.jsonl", "files/sub/b.jsonl"]
    assert (tmp_path / "out/files/a.jsonl").read_bytes() == FILES["a.jsonl"]
    assert (tmp_path / "out/files/sub/b.jsonl").read_bytes() == FILES["sub/b.jsonl"]
    # GCS publishes an md5Hash, S3 an ETag that is the md5 of a single-part upload; both were checked.
    assert all("md5" in entry["published"] for entry in entries.values())
