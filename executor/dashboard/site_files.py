"""What a published site may show, and how its files reach a local folder, `gs://` or `s3://`.

`redact` turns a view's JSON into its public form: the prefix becomes `<prefix>`, any other absolute path of
the machine keeps only its last part (`/home/me/repo/experiments/hero.py` -> `…/hero.py`), config values
whose key says secret (`password`, `token` as a key's last word, `api_key`, `secret`, `credential`...), as a
mapping's key or as the `key` of a config row, become
`<redacted>`, and the fields that name people and machines (`user`, `host`, `worker`) are dropped.

`SiteWriter` writes a file only when its bytes changed since the last write it knows of (its manifest, kept
in the destination as `site-manifest.json`, so a restarted `--watch` does not rewrite the site either), with
the content type its name calls for and a short `Cache-Control` on JSON (pages poll it), a long one on the
packaged scripts. Bytes written are counted, so a cycle's cost is measurable.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
import re
from typing import Any

from executor import storage
from executor.errors import StorageError

MANIFEST = "site-manifest.json"
JSON_CACHE_CONTROL = "public, max-age=5"
ASSET_CACHE_CONTROL = "public, max-age=300"
REDACTED = "<redacted>"
PRIVATE_FIELDS = frozenset({"user", "host", "worker", "hostname", "pid"})
_SECRET_KEY = re.compile(
    r"(secret|password|passwd|api_?key|credential|private_?key|(^|[._-])token$|auth_?token|authorization)", re.I
)
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~>-])/(?:[^\s/\"'<>]+/)+(?=[^\s/\"'<>]+)")


class PublishError(RuntimeError):
    """The destination cannot be written (or the prefix cannot be read); the message says which and why."""


def _redact_text(text: str, prefix: str) -> str:
    text = text.replace(prefix + "/", "<prefix>/").replace(prefix, "<prefix>")
    return _ABSOLUTE_PATH.sub("…/", text)


def redact(value: Any, prefix: str, key: str = "") -> Any:
    """The public form of a view's JSON (module docstring)."""
    if isinstance(value, dict):
        if isinstance(value.get("key"), str) and _SECRET_KEY.search(value["key"]) and "value" in value:
            value = {**value, "value": REDACTED}  # a config row of the step page: {"key", "value", "kind"}
        return {
            _redact_text(str(name), prefix): redact(item, prefix, str(name))
            for name, item in value.items()
            if str(name) not in PRIVATE_FIELDS
        }
    if isinstance(value, list):
        return [redact(item, prefix, key) for item in value]
    if key and _SECRET_KEY.search(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return _redact_text(value, prefix)
    return value


def content_type(name: str) -> str:
    guessed = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if name.endswith(".jsonl"):
        guessed = "application/x-ndjson"
    if guessed.startswith("text/") or guessed.endswith(("javascript", "json", "ndjson")):
        guessed += "; charset=utf-8"
    return guessed


class SiteWriter:
    """Writes the site's files under `destination`, skipping those whose bytes it already wrote."""

    def __init__(self, destination: str):
        self.destination = storage.make_absolute(destination)
        self.fs, self.root = storage.filesystem(self.destination)
        self.bytes_written = 0
        self.files_written = 0
        try:
            manifest = storage.read_json(storage.join(self.destination, MANIFEST))
        except (OSError, StorageError, ValueError) as error:
            raise PublishError(
                f"cannot use {self.destination} as the site's destination (reading its {MANIFEST} failed: {error}); "
                "pass a folder, gs:// or s3:// path that you can write"
            ) from error
        self.manifest: dict[str, str] = manifest if isinstance(manifest, dict) else {}
        self._saved_manifest = json.dumps(self.manifest, sort_keys=True).encode()

    def write(self, relative: str, data: bytes) -> bool:
        """Write `data` at `relative` unless the site already holds these bytes there; True when written."""
        digest = hashlib.sha256(data).hexdigest()
        if self.manifest.get(relative) == digest:
            return False
        self._put(relative, data)
        self.manifest[relative] = digest
        return True

    def write_json(self, relative: str, value: Any) -> bool:
        return self.write(relative, json.dumps(value, separators=(",", ":"), default=str).encode())

    def _put(self, relative: str, data: bytes) -> None:
        target = f"{self.root.rstrip('/')}/{relative}"
        kind = content_type(relative)
        cache = JSON_CACHE_CONTROL if ".json" in relative else ASSET_CACHE_CONTROL
        try:
            if self.destination.startswith("gs://"):
                self.fs.pipe_file(target, data, content_type=kind, fixed_key_metadata={"cache_control": cache})
            elif self.destination.startswith("s3://"):
                self.fs.pipe_file(target, data, ContentType=kind, CacheControl=cache)
            else:
                storage.write_atomic(storage.join(self.destination, relative), data)
        except (OSError, StorageError) as error:
            raise PublishError(
                f"cannot write {relative} to the site at {self.destination}: {error}; check that the destination "
                "exists and is writable (for gs:// and s3://: the bucket and your credentials)"
            ) from error
        self.bytes_written += len(data)
        self.files_written += 1

    def save_manifest(self) -> None:
        """Store the manifest, unless this cycle wrote nothing (an idle cycle writes no byte)."""
        data = json.dumps(self.manifest, sort_keys=True).encode()
        if data != self._saved_manifest:
            self._put(MANIFEST, data)
            self._saved_manifest = data
