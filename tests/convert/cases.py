"""The converter fixtures: where they live, the flags each converts with, how each runs tiny.

Single-file cases are ``fixtures/convert/NAME.in.py -> NAME.out.py`` with the options and the
tiny run in ``NAME.case.json``; a multi-file case is a directory ``fixtures/convert/NAME/in/``
converted together into ``NAME/out/``, with ``NAME/case.json``. Adding a case is adding files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mnify.rewrites.options import ConvertOptions

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "convert"


@dataclass(frozen=True)
class Case:
    name: str
    options: ConvertOptions = ConvertOptions()
    # command line for a tiny CPU run (original and converted alike)
    run_args: tuple[str, ...] = ()
    entry: str = "train.py"  # multi-file cases: the script to run
    # glob patterns of files rank 0 writes in its working directory (rank 1 writes nothing)
    writes: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def multi(self) -> bool:
        return (FIXTURES / self.name).is_dir()

    @property
    def source(self) -> Path:
        return FIXTURES / self.name / "in" if self.multi else FIXTURES / f"{self.name}.in.py"

    @property
    def expected(self) -> Path:
        return FIXTURES / self.name / "out" if self.multi else FIXTURES / f"{self.name}.out.py"


def _load(name: str, sidecar: Path) -> Case:
    """A case from its sidecar: ``{"run_args": [...], "writes": [...], "options": {...},
    "entry": "train.py"}`` (all optional)."""
    data = json.loads(sidecar.read_text(encoding="utf-8")) if sidecar.exists() else {}
    options = data.get("options", {})
    if "only_codes" in options:
        options["only_codes"] = frozenset(options["only_codes"])
    return Case(
        name,
        options=ConvertOptions(**options),
        run_args=tuple(data.get("run_args", ())),
        entry=data.get("entry", "train.py"),
        writes=tuple(data.get("writes", ())),
    )


def discover() -> list[Case]:
    """Every fixture, found by glob: ``NAME.in.py`` (sidecar ``NAME.case.json``) and
    ``NAME/in/`` (sidecar ``NAME/case.json``)."""
    found = [
        _load(
            p.name.removesuffix(".in.py"), p.with_name(p.name.removesuffix(".in.py") + ".case.json")
        )
        for p in FIXTURES.glob("*.in.py")
    ]
    found += [_load(p.name, p / "case.json") for p in FIXTURES.iterdir() if (p / "in").is_dir()]
    return sorted(found, key=lambda c: c.name)


CASES = discover()
BY_NAME = {c.name: c for c in CASES}


def read_sources(case: Case) -> dict[str, str]:
    """``{path: text}`` of the case's input file(s), paths relative to the fixtures dir."""
    if case.multi:
        files = sorted(case.source.glob("*.py"))
    else:
        files = [case.source]
    return {str(f.relative_to(FIXTURES)): f.read_text(encoding="utf-8") for f in files}


def expected_path(case: Case, source_rel: str) -> Path:
    if case.multi:
        return case.expected / Path(source_rel).name
    return case.expected
