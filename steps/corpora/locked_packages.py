"""The files of the packages `requirements.lock` pins, read only as the lock and each wheel's RECORD allow.

A step that draws text from installed packages names its bytes by the lock file: `locked_files(lock_file)` lists
every file of every package the lock pins (from each installed distribution's RECORD, never a directory walk, so
whatever else lies in site-packages is not seen), after checking that the installed version is the locked one.
`read_verified(file)` returns a file's bytes only if their sha256 is the one RECORD holds (the wheel's own), so an
edited install fails loudly instead of changing the text under the same step hash. Packages installed beside the
lock (pip, uv, the project itself in editable mode) are not in it and so never read.

    files = locked_files("requirements.lock")       # LockedFile(package, version, path, sha256), sorted
    text = read_verified(files[0]).decode()
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from executor import ConfigError


class LockedPackageError(ConfigError):
    """The installed packages are not the locked ones (or a locked file's bytes are not the wheel's)."""


@dataclass(frozen=True)
class LockedFile:
    package: str
    """The distribution's name as the lock spells it (normalized: lower case, dashes)."""
    version: str
    """Its version in the lock, which is the installed one (checked)."""
    path: str
    """The file's path relative to site-packages, as RECORD lists it."""
    sha256: str
    """The file's sha256 (hex) as the wheel's RECORD holds it."""
    root: str
    """The site-packages folder the distribution is installed in."""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def locked_versions(lock_file: str | Path) -> dict[str, str]:
    """Package -> version, for every `name==version` line of a pip-style lock file (uv pip compile's output)."""
    versions: dict[str, str] = {}
    for line in Path(lock_file).read_text(encoding="utf-8").splitlines():
        requirement = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in requirement and not requirement.startswith("-"):
            name, _, version = requirement.partition("==")
            versions[normalize(name.split("[", 1)[0].strip())] = version.strip()
    return versions


def installed_distributions() -> dict[str, importlib.metadata.Distribution]:
    """Normalized name -> the distribution installed in this interpreter's site-packages (not user site, not
    PYTHONPATH: only what `make install` put in .venv)."""
    roots = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    found: dict[str, importlib.metadata.Distribution] = {}
    for distribution in importlib.metadata.distributions(path=roots):
        found.setdefault(normalize(distribution.metadata["Name"]), distribution)
    return found


def locked_files(lock_file: str | Path) -> list[LockedFile]:
    """Every file of every locked package, sorted by package and path; refuses a missing or other version."""
    installed = installed_distributions()
    files: list[LockedFile] = []
    for package, version in sorted(locked_versions(lock_file).items()):
        distribution = installed.get(package)
        if distribution is None or Version(distribution.version) != Version(version):
            found = "is not installed" if distribution is None else f"is installed at {distribution.version}"
            raise LockedPackageError(
                f"{package}=={version} is pinned by {lock_file} but {found}; run `make install` (it syncs .venv "
                "to the lock), so that text read from installed packages is the locked text"
            )
        files += _record(distribution, package, version)
    return files


def _record(distribution: importlib.metadata.Distribution, package: str, version: str) -> list[LockedFile]:
    """The files RECORD lists with a sha256 (RECORD itself and generated files have none), inside site-packages."""
    record = distribution.read_text("RECORD")
    if record is None:
        raise LockedPackageError(f"{package}=={version} has no RECORD; reinstall it with `make install`")
    root = str(Path(str(distribution.locate_file(""))))
    files = []
    for row in csv.reader(record.splitlines()):
        if len(row) < 2 or not row[1].startswith("sha256=") or row[0].startswith(("..", "/")):
            continue
        digest = base64.urlsafe_b64decode(row[1].removeprefix("sha256=") + "==").hex()
        files.append(LockedFile(package, version, row[0], digest, root))
    return sorted(files, key=lambda file: file.path)


def read_verified(file: LockedFile) -> bytes:
    """The file's bytes, if they are the wheel's (RECORD's sha256); else LockedPackageError."""
    path = Path(file.root) / file.path
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != file.sha256:
        raise LockedPackageError(
            f"{path} ({file.package}=={file.version}) has sha256 {digest[:12]}…, but its wheel's RECORD says "
            f"{file.sha256[:12]}…: the install was edited; run `make install` to restore the locked files"
        )
    return data
