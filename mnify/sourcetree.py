"""Walking and copying a user's project tree without ever following a symbolic link into a loop.

Directories reached through a symbolic link are not entered: such a link can point back up the
tree (a loop) or out of the project. When a tree is copied, links are copied as links, except
for the files given new contents, which become regular files. Anything that cannot be read or
copied becomes a ``TreeProblem`` and the rest goes on.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from mnify.sourcefile import describe_os_error, write_file


@dataclass(frozen=True)
class TreeProblem:
    """A path below the tree that could not be listed or copied, and why."""

    path: Path
    reason: str


def python_files(root: Path, skip_dirs: Collection[str]) -> tuple[list[Path], list[TreeProblem]]:
    """``*.py`` below ``root`` in sorted order, skipping hidden directories and ``skip_dirs``.

    Symbolic links to files are listed (also dangling ones: reading them says what is wrong);
    links to directories are not entered."""
    problems: list[TreeProblem] = []

    def unlistable(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename else root
        problems.append(TreeProblem(where, describe_os_error(where, exc)))

    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=unlistable):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        found.extend(Path(dirpath) / name for name in sorted(filenames) if name.endswith(".py"))
    return found, problems


def copy_tree(
    source: Path, destination: Path, ignore: Collection[str], replace: Mapping[Path, bytes]
) -> list[TreeProblem]:
    """Copy ``source`` to a new ``destination``, with ``replace``'s files (paths relative to
    ``source``) holding the given bytes instead of their own; what could not be copied.

    Raises ``OSError`` when ``destination`` itself cannot be created. Directory modes are set
    last, so a read-only directory is still filled."""
    os.makedirs(destination)
    problems: list[TreeProblem] = []
    directories: list[tuple[Path, Path]] = [(source, destination)]
    pending = [(source, destination)]
    while pending:
        here, there = pending.pop()
        try:
            with os.scandir(here) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            problems.append(TreeProblem(here, describe_os_error(here, exc)))
            continue
        for entry in entries:
            if entry.name in ignore:
                continue
            path, copy = Path(entry.path), there / entry.name
            try:
                relative = path.relative_to(source)
                if relative in replace:
                    _write_copy(path, copy, replace[relative])
                elif entry.is_symlink():
                    os.symlink(os.readlink(path), copy)
                elif entry.is_dir():
                    os.mkdir(copy)
                    directories.append((path, copy))
                    pending.append((path, copy))
                elif entry.is_file():
                    shutil.copy2(path, copy)
                else:
                    problems.append(TreeProblem(path, "not a regular file; not copied"))
            except OSError as exc:
                problems.append(TreeProblem(path, describe_os_error(path, exc)))
    for original, copy in reversed(directories):
        try:
            shutil.copystat(original, copy)
        except OSError:
            pass  # the contents are there; only the directory's mode or times differ
    return problems


def _write_copy(original: Path, copy: Path, data: bytes) -> None:
    """``data`` as a regular file at ``copy`` with ``original``'s mode (a link's target's)."""
    write_file(copy, data, follow_symlinks=False)
    try:
        os.chmod(copy, stat.S_IMODE(os.stat(original).st_mode))
    except FileNotFoundError:
        pass
