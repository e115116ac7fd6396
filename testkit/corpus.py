"""The corpus of single-file training scripts: where they live, how each runs tiny, what it writes.

Scripts are ``fixtures/corpus/scripts/*.py`` (found by glob); ``cases.toml`` beside them gives
each one's argv for a few-second CPU run, the files that run writes (glob patterns), the input
files it needs, and the checks the converter is known to fail today (tests/convert/test_corpus.py
makes them strict xfails, so a converter fix flips them and the table must then be updated).
bench/verify_corpus.py runs the same scripts under ``mnify run --verify``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's 3.10 floor
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "fixtures" / "corpus" / "scripts"
TABLE = SCRIPTS / "cases.toml"

# What tests/convert/test_corpus.py checks per script; known_failures keys must be among these.
CHECKS = (
    "original",
    "convert",
    "unchanged",
    "deterministic",
    "idempotent",
    "signatures",
    "scatter",
    "lint",
    "compile",
    "e2e",
)
INPUTS_PLACEHOLDER = "{inputs}"


@dataclass(frozen=True)
class CorpusScript:
    """One corpus script and how to run it."""

    name: str
    args: tuple[str, ...]
    writes: tuple[str, ...]
    inputs: tuple[Mapping[str, Any], ...] = ()
    known_failures: Mapping[str, str] = field(default_factory=dict)
    # why the e2e check cannot compare which examples each rank trained on (fewer iterations
    # than two epochs, fresh noise added to each example as it is read, examples that repeat)
    examples_unchecked: str = ""

    @property
    def path(self) -> Path:
        return SCRIPTS / f"{self.name}.py"

    @property
    def source(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def already_distributed(self) -> bool:
        """A ChainerMN script: conversion must leave it as it is."""
        return self.name.startswith("chainermn_")

    def argv(self, inputs_dir: Path) -> list[str]:
        return [a.replace(INPUTS_PLACEHOLDER, str(inputs_dir)) for a in self.args]

    def make_inputs(self, inputs_dir: Path) -> None:
        """Create the files this script reads (deterministic content)."""
        inputs_dir.mkdir(parents=True, exist_ok=True)
        for spec in self.inputs:
            target = inputs_dir / str(spec["path"])
            target.parent.mkdir(parents=True, exist_ok=True)
            kind = spec["kind"]
            if kind == "classification":
                rng = np.random.RandomState(0)
                n, dim, classes = int(spec["n"]), int(spec["dim"]), int(spec["classes"])
                x = rng.randn(n, dim).astype(np.float32)
                t = (np.arange(n) % classes).astype(np.int32)
                x[np.arange(n), t] += 2.0
                with target.open("wb") as f:
                    np.savez(f, x=x, t=t)
            elif kind == "json":
                target.write_text(json.dumps(spec["content"], sort_keys=True), encoding="utf-8")
            else:
                raise ValueError(f"{self.name}: unknown input kind {kind!r}")


def read_table() -> dict[str, dict[str, Any]]:
    with TABLE.open("rb") as f:
        return tomllib.load(f)


def script_names() -> list[str]:
    return sorted(p.stem for p in SCRIPTS.glob("*.py"))


def load_corpus() -> list[CorpusScript]:
    """Every script found by glob, with its row of the table (an empty row when it has none:
    the table's own test reports the gap, the conversion checks still run)."""
    table = read_table()
    corpus = []
    for name in script_names():
        row = table.get(name, {})
        corpus.append(
            CorpusScript(
                name=name,
                args=tuple(str(a) for a in row.get("args", ())),
                writes=tuple(str(w) for w in row.get("writes", ())),
                inputs=tuple(row.get("inputs", ())),
                known_failures=dict(row.get("known_failures", {})),
                examples_unchecked=str(row.get("examples_unchecked", "")),
            )
        )
    return corpus
