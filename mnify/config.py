"""``[tool.mnify]`` in pyproject.toml, found like ruff finds ``[tool.ruff]``: the closest
pyproject.toml with a ``[tool.mnify]`` table, walking up from each linted path.

Keys (dashes or underscores): ``select``, ``ignore``, ``extend-select`` (lists of codes/prefixes/
``ALL``), ``per-file-ignores`` (glob -> codes; globs are relative to the pyproject's directory, or
match the file name when they contain no ``/``), ``exclude`` (globs skipped when walking
directories). Unknown keys are an error, as in ruff.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib

_KEYS = {"select", "ignore", "extend-select", "per-file-ignores", "exclude"}


class ConfigError(ValueError):
    """A pyproject.toml whose ``[tool.mnify]`` table cannot be used."""


@dataclass(frozen=True)
class LintConfig:
    """Settings from one ``[tool.mnify]`` table (or the defaults when ``source`` is None)."""

    source: Path | None = None
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = field(default_factory=tuple)

    @property
    def root(self) -> Path | None:
        return None if self.source is None else self.source.parent

    def _relative(self, path: Path) -> str:
        resolved = path.resolve()
        root = self.root
        if root is not None:
            try:
                return resolved.relative_to(root.resolve()).as_posix()
            except ValueError:
                pass
        return path.as_posix()

    def _matches(self, path: Path, pattern: str) -> bool:
        if "/" not in pattern.rstrip("/") and fnmatch.fnmatch(path.name, pattern):
            return True
        return fnmatch.fnmatch(self._relative(path), pattern.rstrip("/"))

    def per_file_ignores_for(self, path: Path) -> tuple[str, ...]:
        """The codes of every ``per-file-ignores`` glob that matches ``path``."""
        return tuple(
            code
            for pattern, codes in self.per_file_ignores
            if self._matches(path, pattern)
            for code in codes
        )

    def ignores_for(self, path: Path) -> tuple[str, ...]:
        """``ignore`` plus the matching ``per-file-ignores``."""
        return self.ignore + self.per_file_ignores_for(path)

    def excludes(self, path: Path) -> bool:
        return any(self._matches(path, pattern) for pattern in self.exclude)


def _codes(value: Any, key: str, source: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: [tool.mnify] {key} must be a list of strings")
    return tuple(value)


def load_config(pyproject: Path) -> LintConfig | None:
    """The ``[tool.mnify]`` table of ``pyproject``, or None when it has none."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: {exc}") from exc
    table = data.get("tool", {}).get("mnify")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.mnify] must be a table")
    options = {key.replace("_", "-"): value for key, value in table.items()}
    unknown = sorted(set(options) - _KEYS)
    if unknown:
        raise ConfigError(f"{pyproject}: unknown [tool.mnify] option(s): {', '.join(unknown)}")
    per_file = options.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{pyproject}: [tool.mnify] per-file-ignores must be a table")
    return LintConfig(
        source=pyproject,
        select=_codes(options["select"], "select", pyproject) if "select" in options else None,
        ignore=_codes(options.get("ignore", []), "ignore", pyproject),
        extend_select=_codes(options.get("extend-select", []), "extend-select", pyproject),
        per_file_ignores=tuple(
            (pattern, _codes(codes, f"per-file-ignores.{pattern}", pyproject))
            for pattern, codes in per_file.items()
        ),
        exclude=_codes(options.get("exclude", []), "exclude", pyproject),
    )


class ConfigFinder:
    """Finds (and caches per directory) the config that governs a path."""

    def __init__(self) -> None:
        self._by_directory: dict[Path, LintConfig] = {}

    def for_path(self, path: Path) -> LintConfig:
        # realpath, not resolve(): resolve() raises on a symlink loop (Python 3.11)
        start = Path(os.path.realpath(path))
        directory = start if start.is_dir() else start.parent
        return self._for_directory(directory)

    def _for_directory(self, directory: Path) -> LintConfig:
        cached = self._by_directory.get(directory)
        if cached is not None:
            return cached
        found: LintConfig | None = None
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            found = load_config(candidate)
        if found is None:
            parent = directory.parent
            found = LintConfig() if parent == directory else self._for_directory(parent)
        self._by_directory[directory] = found
        return found
