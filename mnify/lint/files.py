"""Linting paths: walk directories for ``*.py`` (skipping hidden, virtualenv and build
directories and ``[tool.mnify] exclude`` globs), apply each file's ``[tool.mnify]`` settings,
lint every file and collect per-file errors instead of stopping at the first. Files are decoded
as Python decodes them (``mnify.sourcefile``: BOM, PEP 263 coding cookie)."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mnify.config import ConfigError, ConfigFinder, LintConfig
from mnify.lint.diagnostic import Diagnostic, LintSyntaxError
from mnify.lint.registry import SelectorError
from mnify.lint.runner import lint_source
from mnify.program.effects import ProjectEffects
from mnify.program.walk import FileProgram
from mnify.sourcefile import SourceDecodeError, decode_source, describe_os_error

SKIPPED_DIRECTORIES = frozenset(
    {".git", ".hg", ".venv", "venv", "__pycache__", "node_modules", "build", "dist", ".tox"}
)


@dataclass
class LintResult:
    """Diagnostics from every file, and ``error: cannot lint ...`` lines for those that failed."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files: int = 0
    # training scripts that create no communicator: they run as one process
    single_process: list[str] = field(default_factory=list)


def _config_for(finder: ConfigFinder, path: Path) -> LintConfig:
    """The config governing ``path``; for a symbolic link loop (which ``Path.resolve`` refuses
    before Python 3.13) the one governing the directory it is in, so the loop is reported when
    the file is read rather than ending the run."""
    try:
        return finder.for_path(path)
    except RuntimeError:
        return finder.for_path(path.parent)


def discover(paths: Sequence[Path], finder: ConfigFinder) -> Iterator[Path]:
    """Files named on the command line always; ``*.py`` below directories, sorted; each file
    once even when named twice (directly and through its directory)."""
    seen: set[str] = set()
    for path in paths:
        if path.is_dir():
            candidates = []
            for candidate in sorted(path.rglob("*.py")):
                relative = candidate.relative_to(path).parts[:-1]
                if any(part in SKIPPED_DIRECTORIES or part.startswith(".") for part in relative):
                    continue
                if not _config_for(finder, candidate).excludes(candidate):
                    candidates.append(candidate)
        else:
            candidates = [path]
        for candidate in candidates:
            key = os.path.realpath(candidate)  # unlike Path.resolve, never raises on a link loop
            if key not in seen:
                seen.add(key)
                yield candidate


def lint_paths(
    paths: Sequence[Path],
    *,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] = (),
    extend_select: Sequence[str] = (),
    stdin: bytes | None = None,
    stdin_filename: str = "-",
) -> LintResult:
    """Lint ``paths`` (and ``stdin``, shown and configured as ``stdin_filename``, when given).

    A command-line ``select`` replaces the config's selection (its ``select``,
    ``extend-select`` and ``ignore``; ``per-file-ignores`` still apply); otherwise the command
    line's ``ignore``/``extend_select`` extend the config's."""
    finder = ConfigFinder()
    result = LintResult()
    options = (select, tuple(ignore), tuple(extend_select))
    if stdin is not None:
        _lint_one(result, finder, Path(stdin_filename), lambda: stdin, options)
    for path in discover(paths, finder):
        _lint_one(result, finder, path, path.read_bytes, options)
    result.diagnostics.sort()
    return result


_Options = tuple[Sequence[str] | None, tuple[str, ...], tuple[str, ...]]


def _effects(shown: str, source: str) -> ProjectEffects | None:
    """The file's program effects (its imports resolved through its directory, the project's
    modules and the installed packages, read from source only where asked): what its calls
    build, whatever their names (``LintContext.builds_optimizer``). None when it does not
    parse (the lint says why)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return ProjectEffects({shown: tree})


def _lint_one(
    result: LintResult,
    finder: ConfigFinder,
    path: Path,
    read: Callable[[], bytes],
    options: _Options,
) -> None:
    """Lint one file into ``result``; failures become ``error: cannot lint ...`` lines."""
    select, ignore, extend_select = options
    shown = path.as_posix()
    result.files += 1
    config = _config_for(finder, path)
    chosen: Sequence[str] | None = select
    ignored: tuple[str, ...] = config.per_file_ignores_for(path)
    extended: tuple[str, ...] = ()
    if select is None:
        chosen, ignored, extended = config.select, config.ignores_for(path), config.extend_select
    try:
        source = decode_source(read()).text

        def seen(program: FileProgram) -> None:
            meaning = program.context
            if meaning.is_training_script and not meaning.is_distributed:
                result.single_process.append(shown)

        result.diagnostics.extend(
            lint_source(
                source,
                shown,
                select=chosen,
                ignore=ignored + ignore,
                extend_select=extended + extend_select,
                seen=seen,
                effects=_effects(shown, source),
            )
        )
    except LintSyntaxError as exc:
        result.errors.append(f"error: cannot lint {shown}: {exc.line}:{exc.col}: {exc.reason}")
    except SourceDecodeError as exc:
        result.errors.append(f"error: cannot lint {shown}: {exc}")
    except OSError as exc:
        result.errors.append(f"error: cannot lint {shown}: {describe_os_error(path, exc)}")
    except SelectorError as exc:
        where = config.source if config.source is not None else "command line"
        raise ConfigError(f"{where}: {exc}") from exc
    except Exception as exc:  # a rule bug must not hide the other files' results
        result.errors.append(
            f"error: cannot lint {shown}: internal error: {type(exc).__name__}: {exc}"
        )
