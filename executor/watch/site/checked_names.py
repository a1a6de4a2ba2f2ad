"""The names a published site's files are clean of, kept in the site as salted hashes, so that a publisher started
later re-checks what an earlier one wrote without a name it learns only now.

A publisher learns host and user names as it goes (redaction.py) and hides each from every file it writes from
then on; a name learned after some files went out sends it back over those (publish.py). It holds the names in
memory only, so a publisher started later on the same site cannot tell which names the files it finds were
written without: a name it learns from an event (a step rerun on a new host) may sit in metrics lines an earlier
publisher published before anyone knew it. So the site keeps `publisher-names.json`:

    {"salt": "<32 hex digits>", "names": ["<scrypt(name, salt), 32 hex digits>", ...]}

one hash for each name every published file has been checked against, never the name: the file is as public as
the site, and each guess at a name costs a memory-hard scrypt with this site's own random salt. A publisher
asks `unchecked(names)` for the names it knows whose hash is not there; the files it publishes then are checked
against those, and once every step has been looked at with them known, `add` records them.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable

from executor.watch.site.files import SiteWriter

NAMES_FILE = "publisher-names.json"
SCRYPT = {"n": 2**13, "r": 8, "p": 1, "dklen": 16}
"""About 30 ms a name on one core: a few names per publisher, and as long per guess for anyone with the file."""


class CheckedNames:
    """The names `site`'s files are clean of (module docstring)."""

    def __init__(self, site: SiteWriter):
        self.site = site
        state = site.read_json(NAMES_FILE)
        salt, hashes = (state.get("salt"), state.get("names")) if isinstance(state, dict) else (None, None)
        self._salt = secrets.token_bytes(16)
        self._hashes: set[str] = set()
        """None for a new site (or one older than this file): its files are checked against every name once."""
        if isinstance(salt, str) and re.fullmatch("[0-9a-f]{32}", salt) and isinstance(hashes, list):
            self._salt = bytes.fromhex(salt)
            self._hashes = {item for item in hashes if isinstance(item, str)}
        self._digests: dict[str, str] = {}
        """Each name asked about, its hash (scrypt is slow on purpose: once a name)."""

    def _digest(self, name: str) -> str:
        digest = self._digests.get(name)
        if digest is None:
            digest = self._digests[name] = hashlib.scrypt(name.encode(), salt=self._salt, **SCRYPT).hex()
        return digest

    def unchecked(self, names: Iterable[str]) -> set[str]:
        """Those of `names` that the site's files have not been checked against."""
        return {name for name in names if self._digest(name) not in self._hashes}

    def add(self, names: Iterable[str]) -> None:
        """Record that every file of the site is clean of `names` (written to the site when that is news)."""
        fresh = {self._digest(name) for name in names} - self._hashes
        if fresh:
            self._hashes |= fresh
            self.site.write_json(NAMES_FILE, {"salt": self._salt.hex(), "names": sorted(self._hashes)})
