"""Keep every dashboard read inside the prefix.

A request names files only by paths *relative to the prefix* (`tokenizer/byte_bpe-a78ce32b`,
`logs/step.log`). `resolve_under` turns such a path into a full path under the prefix, or raises
`UnsafePathError` (answered with 400) for anything that could reach elsewhere: `..` or `.`
segments, empty segments (`a//b`), absolute paths, backslashes, NUL bytes and URLs of other
buckets (`gs://other/x`). The result is always `<prefix>/<segments>`, built by joining strings,
so no request can name a different store. On a local prefix, symbolic links are resolved too, so
a link inside the prefix that points outside it is refused.
"""

from __future__ import annotations

import os

from executor.store import storage


class UnsafePathError(ValueError):
    """A request named a path that is not plainly inside the prefix."""


MAX_PATH_CHARS = 1024


def check_relative(relative: str) -> list[str]:
    """The segments of `relative`, or UnsafePathError if it could escape the prefix."""
    if not relative:
        raise UnsafePathError("empty path")
    if len(relative) > MAX_PATH_CHARS:
        raise UnsafePathError(f"path longer than {MAX_PATH_CHARS} characters")
    if "\x00" in relative or "\\" in relative or "://" in relative or ":" in relative.split("/", 1)[0]:
        raise UnsafePathError(f"{relative!r}: only plain relative paths inside the prefix are served")
    if relative.startswith("/") or relative.startswith("~"):
        raise UnsafePathError(f"{relative!r}: absolute paths are refused; name a path relative to the prefix")
    segments = relative.rstrip("/").split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise UnsafePathError(f"{relative!r}: '.', '..' and empty segments are refused")
    return segments


def resolve_under(prefix: str, relative: str) -> str:
    """`<prefix>/<relative>` after checking that it stays inside `prefix` (see the module docstring)."""
    segments = check_relative(relative)
    full = storage.join(prefix, *segments)
    if not storage.is_url(prefix):
        real_prefix = os.path.realpath(prefix)
        real_full = os.path.realpath(full)
        if real_full != real_prefix and not real_full.startswith(real_prefix + os.sep):
            raise UnsafePathError(f"{relative!r} leads outside the prefix through a symbolic link")
    return full
