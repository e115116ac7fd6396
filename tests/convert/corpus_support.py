"""The corpus tests' helpers: one pytest param per corpus script (known failures as strict
xfails), what a run wrote against what it should write, and the per-rank launcher. The corpus
itself (scripts, table, inputs) is described in :mod:`testkit.corpus`.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from testkit.corpus import CHECKS, CorpusScript, load_corpus, read_table, script_names

__all__ = [
    "CHECKS",
    "CORPUS",
    "CorpusScript",
    "files_under",
    "launcher_source",
    "params",
    "read_table",
    "script_names",
    "writes_mismatch",
]

CORPUS = load_corpus()


def params(check: str, scripts: list[CorpusScript] | None = None) -> list[Any]:
    """One pytest param per script for ``check``; known failures are strict xfails."""
    assert check in CHECKS, check
    out = []
    for script in CORPUS if scripts is None else scripts:
        reason = script.known_failures.get(check)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        marks.append(pytest.mark.xdist_group(_worker_group(check, script)))
        out.append(pytest.param(script, id=script.name, marks=marks))
    return out


def _worker_group(check: str, script: CorpusScript) -> str:
    """Which pytest-xdist worker group a check of ``script`` runs in (scripts/test.sh runs
    ``--dist loadgroup``): a script's checks share its cached conversion and single-process run,
    so they run in one worker; the determinism checks share one conversion of the whole corpus
    in fresh interpreters, so they all run in one."""
    return "corpus-determinism" if check == "deterministic" else f"corpus-{script.name}"


def files_under(root: Path) -> list[str]:
    """Every file below ``root``, as sorted POSIX paths relative to it."""
    if not root.exists():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def writes_mismatch(written: list[str], patterns: tuple[str, ...]) -> list[str]:
    """What differs between the files a run wrote and the patterns it should write."""
    problems = [f"nothing matches {p!r}" for p in patterns if not _matches(written, p)]
    problems += [
        f"unexpected file {w!r}" for w in written if not any(fnmatchcase(w, p) for p in patterns)
    ]
    return problems


def _matches(written: list[str], pattern: str) -> bool:
    return any(fnmatchcase(w, pattern) for w in written)


# Runs one script in <base>/rank<N>/ with the given argv. Guarded, so a forkserver or spawn
# child that imports this file as __mp_main__ does nothing.
LAUNCHER = """\
import os, runpy, sys
if __name__ == "__main__":
    if os.environ.get("MNIFY_EXAMPLES_OUT"):
        # records which examples this process trains on (tests/support/examples_seen.py)
        from tests.support.examples_seen import install
        install(os.environ["MNIFY_EXAMPLES_OUT"])
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    workdir = os.path.join({base!r}, "rank" + rank)
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    sys.path.insert(0, {scriptdir!r})
    sys.argv = [{script!r}] + {args!r}
    runpy.run_path({script!r}, run_name="__main__")
"""


def launcher_source(base: Path, script: Path, args: list[str]) -> str:
    return LAUNCHER.format(
        base=str(base), scriptdir=str(script.parent), script=str(script), args=args
    )
