"""Step identity, pure: canonical encoding of versioned values, config walking, hashing, code fingerprints.

No storage is read or written here (code fingerprints read the step function's source file, through
`inspect`). A step's version is a small dict

    {"name": "tokenize",
     "config": {"tokenizer": "gpt2", "input_path": "DEP[0]/docs"},
     "dependencies": ["corpus-<sha256 of corpus's version>"],
     "code_version": null}

whose canonical JSON (sorted keys, no whitespace) is hashed with sha256. A dependency enters as
its name and full hash, never as its whole version dict, so a chain of any depth keeps each
version the same small size. Dependencies are sorted by hash, so reordering config fields never
changes a hash. Unknown types fail closed: `UnversionableValueError`, never `str(obj)`.

Config keys are dotted paths (`model.hidden_dim`, `sources.[0]`, `tags.{1}`). A dict key that could
be read as more than one path (one holding `.`, brackets, braces, quotes or backslashes, or an
empty one) is written as a quoted segment, `sources.["wiki.en"]`, so no two configs share a key.
The same encoder, loosened, writes the human-readable configs in `.executor_info` (`readable_value`).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import hashlib
import importlib.util
import inspect
import json
import math
import re
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from executor.dag.spec import ExecutorStep, InputName, OutputName, StepFunction, VersionedValue
from executor.errors import ConfigError, UnversionableValueError

Marker = VersionedValue | InputName | OutputName


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def hash_version(version: dict[str, Any]) -> tuple[str, str]:
    """A version dict's canonical JSON and the full sha256 hex digest of it."""
    version_str = canonical_json(version)
    return version_str, hashlib.sha256(version_str.encode()).hexdigest()


# --- canonical encoding of values -----------------------------------------------------------


def encode_value(value: Any, where: str) -> Any:
    """Turn a versioned value into canonical JSON data, or raise `UnversionableValueError` naming `where`."""
    return _encode(value, where, False)


def readable_value(value: Any) -> Any:
    """The same encoding for a resolved config that people read (never for identity): what has no
    canonical form (an object, a NaN, a non-str dict key) is written as its `repr` instead of refused."""
    return _encode(value, "", True)


@functools.singledispatch
def _encode(value: Any, where: str, loose: bool) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name), f"{where}.{f.name}", loose) for f in dataclasses.fields(value)}
    if loose:
        return repr(value)
    raise UnversionableValueError(
        f"{where}: a value of type {type(value).__module__}.{type(value).__qualname__} cannot be versioned; "
        "versioned values must be str, int, float, bool, None, enums, or lists/tuples/dicts/dataclasses "
        "of them (convert paths and other objects to str first)"
    )


@_encode.register(str)
@_encode.register(bool)
@_encode.register(type(None))
def _encode_scalar(value: Any, where: str, loose: bool) -> Any:
    return value


@_encode.register(int)
def _encode_int(value: int, where: str, loose: bool) -> Any:
    if isinstance(value, enum.Enum):  # IntEnum and friends
        return _encode(value.value, where, loose)
    return int(value)


@_encode.register(float)
def _encode_float(value: float, where: str, loose: bool) -> Any:
    if math.isfinite(value):
        return float(value)
    if loose:
        return repr(value)
    raise UnversionableValueError(f"{where}: {value} has no canonical JSON form; use a finite float or a str")


@_encode.register(enum.Enum)
def _encode_enum(value: enum.Enum, where: str, loose: bool) -> Any:
    return _encode(value.value, where, loose)


@_encode.register(list)
@_encode.register(tuple)
def _encode_sequence(value: list | tuple, where: str, loose: bool) -> list:
    return [_encode(item, f"{where}.[{index}]", loose) for index, item in enumerate(value)]


@_encode.register(set)
@_encode.register(frozenset)
def _encode_set(value: set | frozenset, where: str, loose: bool) -> list:
    encoded = [_encode(item, f"{where}.{{}}", loose) for item in value]
    return sorted(encoded, key=canonical_json)


@_encode.register(dict)
def _encode_dict(value: dict, where: str, loose: bool) -> dict:
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            if not loose:
                raise UnversionableValueError(f"{where}: dict key {key!r} is not a str; versioned dicts need str keys")
            key = str(key)
        out[key] = _encode(item, join_key(where, key), loose)
    return out


# --- walking a config ----------------------------------------------------------------------


def walk_config(
    config: Any, prefix: str = "", set_order: Callable[[Marker], str] | None = None
) -> Iterator[tuple[str, Marker]]:
    """Yield `(dotted key, marker)` for every marker in `config`.

    Keys look like `model.hidden_dim`, `values.[0]`, `sources.wiki.path`. Set members are keyed
    `name.{i}`, numbered in the order of `set_order(marker)`, which must depend only on content
    (the planner passes one that knows dependency hashes); without it their order is arbitrary.
    """
    if isinstance(config, (VersionedValue, InputName, OutputName)):
        yield prefix, config
        return
    if isinstance(config, ExecutorStep):  # a bare step means its output path, as in Marin
        yield prefix, InputName(config)
        return
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        for f in dataclasses.fields(config):
            yield from walk_config(getattr(config, f.name), _join(prefix, f.name), set_order)
    elif isinstance(config, (list, tuple)):
        for index, item in enumerate(config):
            yield from walk_config(item, _join(prefix, f"[{index}]"), set_order)
    elif isinstance(config, dict):
        for key, item in config.items():
            if isinstance(key, str):
                yield from walk_config(item, join_key(prefix, key), set_order)
            elif any(True for _ in walk_config(item)):
                raise ConfigError(f"{prefix or 'config'}: dict key {key!r} is not a str but its value holds a marker")
    elif isinstance(config, (set, frozenset)):
        members = [(key, marker) for item in config for key, marker in walk_config(item, "", set_order)]
        if set_order is not None:
            members.sort(key=lambda pair: (set_order(pair[1]), pair[0]))
        for index, (key, marker) in enumerate(members):
            yield _join(_join(prefix, f"{{{index}}}"), key), marker


_PLAIN_KEY = re.compile(r"[^.\[\]{}\"\\]+")
"""A dict key that reads as one path segment as it is; any other is quoted."""


def join_key(prefix: str, key: str) -> str:
    """The dotted path of dict entry `key` under `prefix`: `a.b`, or `a.["b.c"]` when `key` needs quoting."""
    return _join(prefix, key if _PLAIN_KEY.fullmatch(key) else f"[{json.dumps(key, ensure_ascii=False)}]")


def _join(prefix: str, key: str) -> str:
    if not key:
        return prefix
    return f"{prefix}.{key}" if prefix else key


def map_config(config: Any, resolve: Callable[[Marker], Any]) -> Any:
    """Return `config` with every marker replaced by `resolve(marker)`; untouched parts are shared.

    A bare `ExecutorStep` is resolved as `InputName(step)`, matching `walk_config`."""
    if isinstance(config, (VersionedValue, InputName, OutputName)):
        return resolve(config)
    if isinstance(config, ExecutorStep):
        return resolve(InputName(config))
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        changes = {}
        for f in dataclasses.fields(config):
            old = getattr(config, f.name)
            new = map_config(old, resolve)
            if new is not old:
                if not f.init:
                    raise ConfigError(f"{type(config).__name__}.{f.name} holds a marker but is not an __init__ field")
                changes[f.name] = new
        return dataclasses.replace(config, **changes) if changes else config
    if isinstance(config, (list, tuple, set, frozenset)):
        items = [map_config(item, resolve) for item in config]
        if all(new is old for new, old in zip(items, config, strict=True)):
            return config
        if isinstance(config, tuple) and hasattr(config, "_fields"):  # NamedTuple keeps its type
            return type(config)(*items)
        return type(config)(items)
    if isinstance(config, dict):
        changed = {key: map_config(item, resolve) for key, item in config.items()}
        if all(changed[key] is item for key, item in config.items()):
            return config
        return type(config)(changed)
    return config


# --- code fingerprints ----------------------------------------------------------------------


def function_name(fn: Callable) -> str:
    if isinstance(fn, StepFunction):
        return fn.reference
    target = inspect.unwrap(getattr(fn, "func", fn))
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{qualname}"


def code_fingerprint(fn: Callable) -> str | None:
    """sha256 of `fn`'s source with comments, docstrings and formatting removed, or None if unknown. A
    `StepFunction`'s is read from its module's file, unimported: the fingerprint the function itself gets."""
    if isinstance(fn, StepFunction):
        return _fingerprint_reference(fn.module, fn.qualname)
    target = inspect.unwrap(getattr(fn, "func", fn))  # functools.partial -> its function
    code = getattr(target, "__code__", None)
    if code is None and callable(target) and not inspect.isfunction(target):  # a callable object
        code = getattr(type(target).__call__, "__code__", None)
    if code is None:
        return None
    return _fingerprint_code(code)


@functools.lru_cache(maxsize=4096)
def _fingerprint_code(code: Any) -> str | None:
    try:
        source = inspect.getsource(code)
    except (OSError, TypeError):
        return None
    return _fingerprint_source(textwrap.dedent(source))


def reference_problem(fn: StepFunction) -> str | None:
    """What is wrong with a step's function reference, found without importing its module (so that a typo fails the
    plan, not the step hours later): a module that cannot be found, or one whose file binds no such name at its top
    level (by a def, a class, an assignment or an import). None where nothing is wrong, or nothing can be read."""
    try:
        spec = importlib.util.find_spec(fn.module)
    except (ImportError, ValueError) as error:
        return f"its function {fn.reference!r} names a module that cannot be found ({error})"
    if spec is None:
        return f"its function {fn.reference!r} names a module that cannot be found on sys.path"
    parsed = _parsed_source(fn.module)
    if parsed is None:
        return None  # not Python source (an extension module): the run imports it
    name, bound = fn.qualname.split(".", 1)[0], _top_level_names(parsed[1])
    if name in bound or "*" in bound:
        return None
    return f"its function {fn.reference!r}: {spec.origin} defines no {name!r} at its top level"


def _top_level_names(statements: list[ast.stmt]) -> set[str]:
    """Names a module's top level binds, inside `if`, `try` and `with` blocks too ("*" for a star import)."""
    names: set[str] = set()
    for node in statements:
        if isinstance(node, _DEFINITIONS):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".", 1)[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(leaf.id for target in targets for leaf in ast.walk(target) if isinstance(leaf, ast.Name))
        for block in ("body", "orelse", "finalbody"):  # an `if`, `try`, `with` or `for` at the top level
            if not isinstance(node, _DEFINITIONS) and isinstance(inner := getattr(node, block, None), list):
                names |= _top_level_names(inner)
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                names |= _top_level_names(handler.body)
    return names


@functools.lru_cache(maxsize=1024)
def _parsed_source(module: str) -> tuple[str, list[ast.stmt]] | None:
    """`module`'s source and its parsed top level, read from its file unimported; None where it has no Python source.
    Finding the file imports the packages above the module, never the module itself."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        with open(spec.origin, encoding="utf-8") as file:
            source = file.read()
        return source, ast.parse(source).body
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


@functools.lru_cache(maxsize=4096)
def _fingerprint_reference(module: str, qualname: str) -> str | None:
    """The function `qualname` (inside classes by dots) of `module`'s source file, from its first decorator to its
    last line, as `inspect.getsource` gives it; None where there is none."""
    parsed = _parsed_source(module)
    if parsed is None:
        return None
    source, scope = parsed
    node: ast.stmt | None = None
    for part in qualname.split("."):
        defined = [child for child in scope if isinstance(child, _DEFINITIONS) and child.name == part]
        if not defined:
            return None
        node = defined[-1]  # the last definition of a name is the one the module holds
        scope = node.body
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
        return None  # a class called as a step: as for any callable object, its code is not read
    first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
    return _fingerprint_source(textwrap.dedent("".join(source.splitlines(keepends=True)[first - 1 : node.end_lineno])))


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _fingerprint_source(source: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a lambda cut out of a larger expression
        normalized = "\n".join(line.split("#", 1)[0].strip() for line in source.splitlines())
        return hashlib.sha256(normalized.encode()).hexdigest()
    top = tree.body[0] if tree.body else None
    if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        top.name = ""  # a rename is not a code change; qualified names are compared separately
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
            and isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()
