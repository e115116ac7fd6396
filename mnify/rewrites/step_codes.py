"""Which MN codes name each converter step (docs/converter.md): a report entry is filed under its
step's code, and every code of a step keeps it off a line in ``# noqa``.

A step that fixes lint rules reports under the first of them; a converter-only step under its own
MN8xx code. :func:`mnify.rewrites.registry.rewrite` enters each rewrite here as it registers;
the steps that are not planning functions (emitted late, or project-wide) are here from the
start. This table sits below both the registry and ``FileContext``, which reads it to file
notes, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepCodes:
    fixes: tuple[str, ...]  # lint rules the step fixes (empty: a converter-only step)
    own_code: str  # the step's MN8xx code ("" for the bookkeeping steps that have none)

    @property
    def code(self) -> str:
        """The code the step's report entries carry: its first lint rule, else its own."""
        return self.fixes[0] if self.fixes else self.own_code

    @property
    def codes(self) -> frozenset[str]:
        """Every code that names this step in ``# noqa`` and ``--select``."""
        return frozenset({*self.fixes, self.own_code} - {""})


_STEPS: dict[str, StepCodes] = {
    # steps that are not planning functions but still have codes (emitted late, or project-wide)
    "threading": StepCodes((), "MN811"),
    "trainers": StepCodes((), "MN813"),
    "lint": StepCodes((), ""),
    "distributed": StepCodes((), ""),
}


def enter_step(step: str, codes: StepCodes) -> None:
    """Record the codes of the rewrite ``step`` (called by the registry as it registers)."""
    _STEPS[step] = codes


def step_codes(step: str) -> frozenset[str]:
    """The codes that name ``step`` (for ``# noqa``); empty for an unknown step."""
    found = _STEPS.get(step)
    return found.codes if found is not None else frozenset()


def step_code(step: str) -> str:
    """The code a report entry of ``step`` carries ("" for an unknown step)."""
    found = _STEPS.get(step)
    return found.code if found is not None else ""
