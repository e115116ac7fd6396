"""Does requirements/dev.lock still satisfy pyproject.toml? Exit 1 with the disagreements.

The lock pins what set-up installs for development and CI (README, "Locked versions");
pyproject.toml keeps ranges for users. They disagree when a requirement of
``[project].dependencies``, the ``dev``, ``plot`` or ``chainer`` extras, or
``requirements/build.in`` has no pin in the lock or a pin outside its range, or when the lock
holds a package that pyproject.toml no longer asks for. Markers are evaluated for the lock's
target, CPython 3.11 on Linux x86_64. Refresh with ``bash scripts/lock.sh``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("dev", "plot", "chainer")
TARGET = {
    **default_environment(),
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}


def wanted(root: Path = ROOT) -> list[tuple[Requirement, str]]:
    """Every requirement the lock must satisfy, with where it is written."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    out = [(Requirement(r), "pyproject.toml dependencies") for r in project["dependencies"]]
    for extra in EXTRAS:
        out += [
            (Requirement(r), f"pyproject.toml [{extra}]")
            for r in project["optional-dependencies"][extra]
        ]
    for line in (root / "requirements" / "build.in").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            out.append((Requirement(line), "requirements/build.in"))
    return [(r, where) for r, where in out if r.marker is None or r.marker.evaluate(TARGET)]


def pins(lock_text: str) -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, via)}`` of a lock written by ``uv pip compile``."""
    out: dict[str, tuple[str, list[str]]] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", lock_text):
        m = re.match(r"([A-Za-z0-9._-]+)==([^\s\\;]+)", entry)
        if not m:
            continue
        via = re.findall(r"#\s+(?:via\s+)?(-r \S+|[A-Za-z0-9._-]+(?: \(pyproject\.toml\))?)", entry)
        out[canonicalize_name(m.group(1))] = (m.group(2), via)
    return out


def disagreements(root: Path = ROOT) -> list[str]:
    lock = root / "requirements" / "dev.lock"
    pinned = pins(lock.read_text())
    problems = []
    named = set()
    for req, where in wanted(root):
        name = canonicalize_name(req.name)
        named.add(name)
        if name not in pinned:
            problems.append(f"{req} ({where}) has no pin in requirements/dev.lock")
        elif not req.specifier.contains(pinned[name][0], prereleases=True):
            problems.append(
                f"{req} ({where}) is not met by the lock's {req.name}=={pinned[name][0]}"
            )
    for name, (version, via) in sorted(pinned.items()):
        if via and all(v.startswith("mnify") or v.startswith("-r ") for v in via):
            if name not in named:
                problems.append(
                    f"requirements/dev.lock pins {name}=={version} that pyproject.toml no "
                    "longer asks for"
                )
    return problems


def main() -> int:
    problems = disagreements()
    for p in problems:
        print(f"lock check: {p}", file=sys.stderr)
    if problems:
        print(
            "lock check: pyproject.toml and requirements/dev.lock disagree; refresh the lock with "
            "`bash scripts/lock.sh` (it also runs the quick tier on the new versions)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
