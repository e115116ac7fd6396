"""Only mnify/environment.py reads ``MNIFY_*`` variables: an AST scan of the package.

Two things give a second reader away: an ``os.environ`` / ``os.getenv`` access whose key spells
``MNIFY_...`` (a literal, an f-string, a concatenation), and a string that is exactly a variable's
name (``ENV = "MNIFY_X"``, the way every reader used to hold its name). Elsewhere a name is
``environment.X.name``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mnify"
THE_READER = PACKAGE / "environment.py"
_NAME = re.compile(r"MNIFY_[A-Z0-9_]*[A-Z0-9]")


def _is_environ(node: ast.expr, environ_names: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id in environ_names


def _spells_mnify(key: ast.expr) -> bool:
    """The key expression contains a string starting ``MNIFY_`` (f-strings and ``+`` too)."""
    return any(
        isinstance(part, ast.Constant)
        and isinstance(part.value, str)
        and part.value.startswith("MNIFY_")
        for part in ast.walk(key)
    )


def _environment_keys(tree: ast.AST) -> Iterator[tuple[int, ast.expr]]:
    """(line, key) of every read or write of the process environment by key."""
    environ_names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "os"
        for alias in node.names
        if alias.name == "environ"
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value, environ_names):
            yield node.lineno, node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and _is_environ(func.value, environ_names):
                yield node.lineno, node.args[0]  # get, pop, setdefault
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in ("getenv", "putenv", "unsetenv")
                and isinstance(func.value, ast.Name)
                and func.value.id == "os"
            ):
                yield node.lineno, node.args[0]
        elif isinstance(node, ast.Compare) and any(
            _is_environ(c, environ_names) for c in node.comparators
        ):
            yield node.lineno, node.left


def second_readers(source: str) -> list[str]:
    """What in ``source`` reads or names an ``MNIFY_*`` variable, as ``line: what``."""
    tree = ast.parse(source)
    found = [
        f"{line}: os.environ keyed by {ast.unparse(key)}"
        for line, key in _environment_keys(tree)
        if _spells_mnify(key)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _NAME.fullmatch(node.value):
                found.append(f"{node.lineno}: the name {node.value!r}")
    return sorted(set(found))


def test_no_module_but_the_environment_module_reads_an_mnify_variable() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != THE_READER and (found := second_readers(path.read_text(encoding="utf-8")))
    }
    assert not offenders, f"read MNIFY_* through mnify.environment instead: {offenders}"


def test_the_scan_finds_each_way_of_reading_one() -> None:
    readers = [
        'import os\nx = os.environ.get("MNIFY_DEBUG", "")\n',
        'import os\nx = os.environ["MNIFY_TIMELINE"]\n',
        'import os\nx = os.getenv("MNIFY_DEBUG")\n',
        'import os\nx = "MNIFY_DEBUG" in os.environ\n',
        'import os\nx = os.environ.get(f"MNIFY_{name}")\n',
        'import os\nx = os.environ.get("MNIFY_" + name)\n',
        'from os import environ as env\nx = env.pop("MNIFY_X")\n',
        'ENV = "MNIFY_EXIT_BARRIER"\n',
    ]
    for source in readers:
        assert second_readers(source), source
    fine = [
        "from mnify import environment\nx = environment.DEBUG.read()\n",
        'import os\nx = os.environ.get("PMIX_RANK")\nPREFIXES = ("MNIFY_",)\n',
        '"""MNIFY_DEBUG=1 makes the ranks compare shapes."""\n',
    ]
    for source in fine:
        assert not second_readers(source), source
