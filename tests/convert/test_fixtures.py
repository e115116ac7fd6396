"""Each fixture converts to exactly its expected output, which parses and is a fixed point."""

from __future__ import annotations

import dataclasses

import libcst as cst
import pytest

from mnify.converter import convert_sources
from tests.convert.cases import CASES, FIXTURES, Case, expected_path, read_sources


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture(case: Case, regen: bool) -> None:
    sources = read_sources(case)
    results = convert_sources(sources, case.options)
    for r in results:
        assert r.error is None, r.error
        assert r.output is not None
        cst.parse_module(r.output)  # output parses
        compile(r.output, r.path, "exec")
        target = expected_path(case, r.path)
        if regen:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(r.output, encoding="utf-8")
            continue
        assert target.exists(), f"missing {target}: run pytest tests/convert --regen"
        assert r.output == target.read_text(encoding="utf-8"), (
            f"{r.path} converts differently from {target.relative_to(FIXTURES)}:\n{r.diff()}"
        )
    assert any(r.changed for r in results), "a fixture that converts to itself tests nothing"
    # Idempotent: converting the converted files (together, as before) changes nothing, even
    # with the already-distributed detection off (so the rewrites themselves are idempotent).
    rewrites_only = dataclasses.replace(case.options, leave_distributed=False)
    again = convert_sources({r.path: r.output or "" for r in results}, rewrites_only)
    for first, second in zip(results, again, strict=True):
        assert second.error is None
        assert second.output == first.output, (
            f"second conversion changed {first.path}:\n{second.diff()}"
        )


def test_every_fixture_has_its_expected_output_and_sidecar() -> None:
    assert len(CASES) >= 8
    for case in CASES:
        sidecar = (
            FIXTURES / case.name / "case.json"
            if case.multi
            else (FIXTURES / f"{case.name}.case.json")
        )
        assert sidecar.exists(), f"{case.name}: no {sidecar.name} (run args and files written)"
        assert case.expected.exists(), f"{case.name}: no expected output; run with --regen"
