"""Step patterns (`--run_only`, `--force_run`, `status --name`, `explain TARGET NAME`): full-match regexes.

A pattern names steps the way `re.fullmatch` reads it: `train/d768` is that step only, `train/d7.*` every step
whose name starts so, `.*/stats` every `stats` step, `eval|stats` either. Full match, not search: a pattern
that selects more than it says can discard a training run (`--force_run d7` must not rerun `train/d768`).

People type globs. A pattern that reads as a glob (a `*` with nothing before it to repeat, or after a
character a regex would not repeat on purpose: `train/d7*`, `*/stats`) is refused before anything runs, with
the regex it probably meant and the steps that one matches, so the run never selects what the glob did not
say. An invalid regex is one line naming the flag, the pattern and the error, never a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from executor.errors import ConfigError

_REPEATABLE = set(".)]}\\")
"""What a regex's `*` follows when it means "repeat": any character, a group, a class, a count, an escape."""
_GLOB_LITERAL = set(".^$+{}()|\\")
"""Characters a glob takes literally and a regex does not: escaped in the suggested regex."""


class PatternError(ConfigError):
    """A step pattern that is not a usable regex (invalid, or a glob); the message is one line with the fix."""


def looks_like_glob(pattern: str) -> bool:
    """Whether a `*` (or a leading `?`) in `pattern` means "anything" as in a shell glob, not a regex repeat."""
    if pattern.startswith(("*", "?")):
        return True
    for position, char in enumerate(pattern):
        if char != "*" or _escaped(pattern, position):
            continue
        before = position - 1
        if pattern[before] not in _REPEATABLE and not _escaped(pattern, before):  # `\w*` repeats a class
            return True
    return False


def _escaped(pattern: str, position: int) -> bool:
    backslashes = len(pattern[:position]) - len(pattern[:position].rstrip("\\"))
    return backslashes % 2 == 1


def glob_as_regex(pattern: str) -> str:
    """The full-match regex a glob means: `*` -> `.*`, `?` -> `.`, `[...]` kept, regex-only characters escaped."""
    parts = []
    for char in pattern:
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        elif char in _GLOB_LITERAL:
            parts.append("\\" + char)
        else:
            parts.append(char)
    return "".join(parts)


def compile_pattern(pattern: str, what: str, names: Iterable[str]) -> re.Pattern[str]:
    """`pattern` as a regex for `fullmatch`; a PatternError (one line) if it is invalid or reads as a glob.
    `names`, the step names it is meant for, show what the suggested regex would select."""
    if looks_like_glob(pattern):
        meant = glob_as_regex(pattern)
        matched = sorted({name for name in names if re.fullmatch(meant, name)})
        listed = f"; it matches {', '.join(matched)}" if matched else "; it matches no step either"
        raise PatternError(
            f"{what} pattern {pattern!r} looks like a glob; step patterns are regexes matched against the whole "
            f"step name: did you mean {meant!r}{listed}. Nothing was run or written"
        )
    try:
        return re.compile(pattern)
    except re.error as error:
        raise PatternError(
            f"{what} pattern {pattern!r} is not a valid regex ({error}); step patterns are regexes matched against "
            "the whole step name, e.g. 'train/d768' or 'train/.*'. Nothing was run or written"
        ) from error
