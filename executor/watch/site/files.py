"""How the published site's files reach a local folder, `gs://` or `s3://` (what they may show: redaction.py).

`SiteWriter` writes a file only when its bytes changed since the last write it knows of (its manifest, kept
in the destination so a restarted `--watch` does not rewrite the site either), with the content type its name
calls for and a short `Cache-Control` on JSON (pages poll it), a long one on the packaged scripts. The
manifest is split by folder (`<folder>/site-manifest.json`, the root's listing the folders), so a cycle that
changes one run's files rewrites that run's small manifests, not one that grows with the whole site. Files
that are written once and never change (a run's metrics chunks: `write_once`) are not in it at all. Bytes
written are counted, so a cycle's cost is measurable.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
from typing import Any

from executor.errors import StorageError
from executor.store import storage

MANIFEST = "site-manifest.json"
JSON_CACHE_CONTROL = "public, max-age=5"
ASSET_CACHE_CONTROL = "public, max-age=300"


class PublishError(RuntimeError):
    """The destination cannot be written (or the prefix cannot be read); the message says which and why."""


def content_type(name: str) -> str:
    guessed = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if name.endswith(".jsonl"):
        guessed = "application/x-ndjson"
    if guessed.startswith("text/") or guessed.endswith(("javascript", "json", "ndjson")):
        guessed += "; charset=utf-8"
    return guessed


def _folder(relative: str) -> str:
    return relative.rsplit("/", 1)[0] if "/" in relative else ""


def _manifest_path(folder: str) -> str:
    return f"{folder}/{MANIFEST}" if folder else MANIFEST


class SiteWriter:
    """Writes the site's files under `destination`, skipping those whose bytes it already wrote."""

    def __init__(self, destination: str):
        self.destination = storage.make_absolute(destination)
        self.fs, self.root = storage.filesystem(self.destination)
        self.bytes_written = 0
        self.files_written = 0
        self.manifest: dict[str, str] = {}
        where = MANIFEST
        try:
            root = self.read_json(MANIFEST)
            folders = root.get("folders", []) if isinstance(root, dict) else []  # older sites: one flat manifest,
            blobs = storage.read_many([storage.join(self.destination, _manifest_path(name)) for name in folders])
            self.manifest.update(root.get("files", {}) if isinstance(root, dict) else {})  # rewritten once
            for folder, blob in zip(folders, blobs, strict=True):
                where = _manifest_path(folder)
                entries = json.loads(blob) if blob else {}
                self.manifest.update((f"{folder}/{name}", digest) for name, digest in entries.items())
        except (OSError, StorageError, ValueError, AttributeError) as error:
            raise PublishError(
                f"cannot use {self.destination} as the site's destination (reading its {where} failed: {error}); "
                f"pass a folder, gs:// or s3:// path that you can write, or delete the broken {MANIFEST}"
            ) from error
        groups = self._grouped()
        self._saved = {folder: groups.get(folder, {}) for folder in folders}
        self._saved_root = {"folders": sorted(folders), "files": groups.get("", {})}

    def read_json(self, relative: str) -> Any | None:
        """A JSON file of the site as it stands in the destination (None when there is none)."""
        return storage.read_json(storage.join(self.destination, relative))

    def write(self, relative: str, data: bytes) -> bool:
        """Write `data` at `relative` unless the site already holds these bytes there; True when written."""
        digest = hashlib.sha256(data).hexdigest()
        if self.manifest.get(relative) == digest:
            return False
        self._put(relative, data)
        self.manifest[relative] = digest
        return True

    def write_once(self, relative: str, data: bytes) -> None:
        """Write a file that is never rewritten (its name says what it holds), outside the manifest."""
        self._put(relative, data)

    def remove(self, relative: str) -> None:
        """Delete a file written by `write_once` (it is in no manifest)."""
        try:
            storage.delete(storage.join(self.destination, relative))
        except (OSError, StorageError) as error:
            raise PublishError(f"cannot delete {relative} from the site at {self.destination}: {error}") from error

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

    def _grouped(self) -> dict[str, dict[str, str]]:
        """The manifest's entries by folder, each by file name."""
        groups: dict[str, dict[str, str]] = {}
        for relative, digest in self.manifest.items():
            groups.setdefault(_folder(relative), {})[relative.rsplit("/", 1)[-1]] = digest
        return groups

    def save_manifest(self) -> None:
        """Store the manifests of the folders whose entries changed (an idle cycle writes no byte); the root's
        lists the folders and holds the root's own files."""
        groups = self._grouped()
        root = {"folders": sorted(set(groups) - {""}), "files": groups.pop("", {})}
        for folder, entries in sorted(groups.items()):
            if entries != self._saved.get(folder):
                self._put(_manifest_path(folder), json.dumps(entries, sort_keys=True).encode())
                self._saved[folder] = entries
        if root != self._saved_root:
            self._put(MANIFEST, json.dumps(root, sort_keys=True).encode())
            self._saved_root = root
