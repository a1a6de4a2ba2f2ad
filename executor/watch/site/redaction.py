"""What a published site may show: every JSON value the publisher writes passes through `Redactor`.

It denies by default what could identify a machine or a person or open a door, wherever it sits (a config
value, a status event's details, a metrics line, an alert's message), instead of listing known leaks:

- a value whose key has a secret-sounding word (`secret`, `password`, `token`, `key`, `credential`, `webhook`,
  `auth`, `cookie`, `dsn`, ... as a word of `api_key`, `alerts.webhook_url`, `hfToken`) becomes `<redacted>`,
  as a mapping's entry or as the value of a `{"key": ..., "value": ...}` row (the step page's config);
- fields that name people and machines (`user`, `host`, `hostname`, `worker`, `pid`, `ip`, `node_id`) are dropped;
- in any text: a private key block (`-----BEGIN ... PRIVATE KEY-----`) goes whole; a credential written as
  `key=value` or `key: value` (`aws_secret_access_key=...`, `password: ...`, `token=...`, a key that reads as a
  secret as above) keeps its key, and a bearer or basic `Authorization` header its scheme; the prefix becomes
  `<prefix>`; any other URL keeps only its scheme (`gs://<redacted>`: another bucket's path, a webhook's secret
  path, `https://user:password@...` credentials and query tokens alike), and a webhook or web address written
  without one keeps only its host (`hooks.slack.com/<redacted>`); `user:password@` goes; an email address becomes
  `<email>`; a home folder's user name (`/home/<user>/`, `/Users/<user>/`, `~<user>/`) becomes `<user>` and is
  learned; any other absolute path keeps only its last part (`/srv/me/repo/hero.py` -> `…/hero.py`); `host:pid`
  (a run id, a lease holder) becomes `<host>:<pid>`; IPv4 addresses, `pid 123`, this machine's host and user
  names, every name learned so far, and strings shaped like well-known tokens (`ghp_…`, `xoxb-…`, `hf_…`,
  `AKIA…`, `sk-…`) are replaced;
- a string holding a JSON object (a version dict's canonical JSON) is redacted inside and written back;
- a number that is not finite becomes the string `"nan"` / `"inf"` (JSON has no NaN: a browser refuses it).
"""

from __future__ import annotations

import getpass
import json
import math
import re
import socket
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

REDACTED = "<redacted>"
PRIVATE_FIELDS = frozenset({"user", "host", "worker", "hostname", "pid", "ip", "node_id", "node_ip", "address"})
SECRET_WORDS = frozenset(
    {
        "secret", "secrets", "password", "passwd", "passphrase", "pwd", "token", "key", "apikey", "credential",
        "credentials", "webhook", "auth", "authorization", "cookie", "dsn", "signature", "sig",
    }
)  # fmt: skip
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]{1,15})://[^\s\"'<>]+")
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~>-])/(?:[^\s/\"'<>]+/)+(?=[^\s/\"'<>]+)")
_HOST_PID = re.compile(r"(?<![\w.<-])[A-Za-z][\w.-]*:\d{1,7}(?![\d.])")
_IPV4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w.])")
_PID = re.compile(r"\bpid[ =:]*\d+", re.I)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|$)", re.S
)
_AUTH_HEADER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=:-]{6,}", re.I)
_KEY_VALUE = re.compile(
    r"""(?P<key>[A-Za-z_][\w.-]*)(?P<sep>["']?\s*[:=]\s*)(?P<value>"[^"]*"|'[^']*'|[^\s,;&"'<>]+)"""
)
_USER_AT = re.compile(r"[^\s\"'<>/@:]+:[^\s\"'<>/@]+@(?=[\w-]+\.)")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_WEB_PATH = re.compile(
    r"\b((?:[a-zA-Z0-9-]+\.)+(?:com|org|net|io|ai|dev|co|app|cloud|us|uk|de|fr|info|biz|xyz))/[^\s\"'<>]+"
)
_USER_MARK = "\x00user\x00"
"""A home folder's user name while the path around it is shortened (`<>` would end the path there)."""
_HOME = re.compile(r"(/home/|/Users/|(?<![\w/])~)([^\s/\"'<>]+)")
_TOKEN_SHAPED = re.compile(r"\b(?:gh[pousr]_|github_pat_|xox[abposr]-|hf_|sk-|AKIA)[A-Za-z0-9_-]{12,}")


@lru_cache(maxsize=4096)
def secret_key(name: str) -> bool:
    """Whether a key reads as naming a secret: one of its words (split at `._-/` and camelCase) is in
    SECRET_WORDS. The bare field name `key` is none: it names a config row's or a metric's key."""
    if name == "key":
        return False
    return any(word.lower() in SECRET_WORDS for word in _WORD.findall(name))


def _hide_credential(match: re.Match[str]) -> str:
    """`key=value` / `key: value` in free text, its value hidden when the key reads as a secret's."""
    if not secret_key(match.group("key")) or match.group("value").strip("\"'") in ("", REDACTED):
        return match.group(0)
    return f"{match.group('key')}{match.group('sep')}{REDACTED}"


class Redactor:
    """The public form of any JSON value (module docstring); `prefix` is the published prefix."""

    def __init__(self, prefix: str, private_names: tuple[str, ...] = ()):
        self.prefix = prefix.rstrip("/")
        self.whole_values: set[str] = set()
        """Names replaced when a string is exactly one: short ones ("vm", "me") occur inside ordinary words."""
        self._words: set[str] = set()
        self._names: re.Pattern[str] | None = None
        self._keys: dict[str, str] = {}
        """Mapping keys seen, in their public form: a run's thousands of lines repeat the same few keys."""
        self.learn_names((socket.gethostname(), socket.gethostname().split(".")[0], getpass.getuser(), *private_names))

    def learn_names(self, names: Iterable[str]) -> None:
        """Scrub these host and user names from every text from now on (whole words, 4 characters or more)."""
        fresh = {name for name in names if name and name not in self.whole_values}
        if not fresh:
            return
        self.whole_values |= fresh
        self._words |= {name for name in fresh if len(name) >= 4}
        if self._words:
            longest_first = sorted(self._words, key=len, reverse=True)
            self._names = re.compile("|".join(rf"(?<![\w-]){re.escape(name)}(?![\w-])" for name in longest_first))
        self._keys.clear()

    def learn(self, value: Any) -> None:
        """Learn the names in a document's private fields without redacting it (the publisher learns from every
        file of a cycle before it writes any, so a name learned from one is hidden in all)."""
        self._learn_from(value)

    def _learn_from(self, value: Any) -> None:
        """The names in a document's private fields (a `host`, a `worker`'s `host:pid`), before they are dropped,
        so the same name in a message elsewhere in it is scrubbed too."""
        if isinstance(value, dict):
            for name, item in value.items():
                if name in PRIVATE_FIELDS and isinstance(item, str):
                    self.learn_names([item, item.split(":")[0]])
                elif isinstance(item, dict | list):
                    self._learn_from(item)
        elif isinstance(value, list):
            for item in value:
                self._learn_from(item)

    def text(self, text: str) -> str:
        if text in self.whole_values:
            return REDACTED
        if text.startswith("{") and text.endswith("}"):
            try:
                document = json.loads(text)
            except ValueError:
                document = None
            if isinstance(document, dict):
                return json.dumps(self._value(document), sort_keys=True, separators=(",", ":"))
        text = _PRIVATE_KEY.sub(f"{REDACTED} private key", text)
        text = _AUTH_HEADER.sub(lambda match: f"{match.group(1)} {REDACTED}", text)
        text = _KEY_VALUE.sub(_hide_credential, text)
        text = text.replace(self.prefix + "/", "<prefix>/").replace(self.prefix, "<prefix>")
        text = _URL.sub(lambda match: f"{match.group(1)}://{REDACTED}", text)
        text = _USER_AT.sub("", text)
        text = _EMAIL.sub("<email>", text)
        text = _WEB_PATH.sub(lambda match: f"{match.group(1)}/{REDACTED}", text)
        text = _HOME.sub(self._home, text)
        text = _ABSOLUTE_PATH.sub("…/", text).replace(_USER_MARK, "<user>")
        text = _TOKEN_SHAPED.sub(REDACTED, text)
        text = _HOST_PID.sub("<host>:<pid>", text)
        text = _IPV4.sub("<ip>", text)
        text = _PID.sub("pid <pid>", text)
        return self._names.sub(REDACTED, text) if self._names else text

    def _home(self, match: re.Match[str]) -> str:
        """A home folder's user name: hidden here, and learned, so it is hidden wherever else it is written."""
        user = match.group(2)
        if user not in ("<user>", _USER_MARK):
            self.learn_names([user])
        return f"{match.group(1)}{_USER_MARK}"

    def _key(self, name: str) -> str:
        public = self._keys.get(name)
        if public is None:
            public = self._keys[name] = self.text(name)
        return public

    def value(self, value: Any) -> Any:
        """The public form of one JSON document."""
        self._learn_from(value)
        return self._value(value)

    def _value(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            if isinstance(value.get("key"), str) and secret_key(value["key"]):  # a {"key", "value", ...} row
                kept = ("key", "kind", "dependency")
                value = {name: item if name in kept else REDACTED for name, item in value.items()}
            public = {}
            for name, item in value.items():
                name = str(name)
                if name in PRIVATE_FIELDS:
                    continue
                plain = type(item) is int or (type(item) is float and math.isfinite(item))
                # A plain number under a key that is no secret needs no more look (most of a metrics line).
                public[self._key(name)] = item if plain and not secret_key(name) else self._value(item, name)
            return public
        if isinstance(value, list):
            return [self._value(item, key) for item in value]
        if key and secret_key(key) and value not in (None, "", REDACTED):
            return REDACTED
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # JSON has no NaN: "nan", "inf", as alerts.jsonl writes them
        return value


def redact(value: Any, prefix: str) -> Any:
    """`Redactor(prefix).value(value)`: the public form of one JSON value."""
    return Redactor(prefix).value(value)
