"""The registry of rewrites: one code space for what lint finds and what convert fixes.

Every rewrite module registers its planning function with :func:`rewrite`, naming its step,
its place in the order, and the lint rules it fixes (TorchFix's way: the finding carries its
fix). The report files a rewrite's entries under its rule code, and ``# noqa: MN503`` keeps
the optimizer rewrite off a line exactly as it silences lint's MN503 there. Steps only the
converter takes (creating the communicator, scaling, model parallel, threading ``comm``) have
codes of their own (MN8xx); the MN80x codes each step had before the registry still work in
``# noqa``.

Adding a rewrite is one module that calls :func:`rewrite` (it is found by
``mnify.converter.steps.load_rewrites``) and one fixture pair; a rewrite that fixes one hazard lives in that
hazard's module (mnify/hazards/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mnify.rewrites.step_codes import StepCodes, enter_step

if TYPE_CHECKING:
    from mnify.rewrites.context import FileContext

PlanFn = Callable[["FileContext"], None]


@dataclass(frozen=True)
class Rewrite:
    step: str  # what the report and messages call it ("optimizer", "rank0-guard")
    order: int  # planning order; later steps see earlier steps' edits
    fixes: tuple[str, ...]  # lint rules this rewrite fixes (empty: a converter-only step)
    own_code: str  # the MN8xx code of the step (converter-only steps report under it)
    plan: PlanFn
    # docs/converter.md's section for the step; None: the docstring of the module registering
    # it (a hazard module that owns its fix documents the hazard in its own docstring)
    doc: str | None = None

    @property
    def code(self) -> str:
        """The code the step's report entries carry: its first lint rule, else its own."""
        return StepCodes(self.fixes, self.own_code).code

    @property
    def codes(self) -> frozenset[str]:
        """Every code that names this step in ``# noqa`` and ``--select``."""
        return StepCodes(self.fixes, self.own_code).codes


_REWRITES: dict[str, Rewrite] = {}


def rewrite(
    step: str, *, order: int, fixes: tuple[str, ...] = (), code: str, doc: str | None = None
) -> Callable[[PlanFn], PlanFn]:
    """Register the decorated ``plan(ctx)`` as the rewrite ``step``."""

    def register(plan: PlanFn) -> PlanFn:
        if step in _REWRITES and _REWRITES[step].plan is not plan:
            raise ValueError(f"rewrite step {step!r} registered twice")
        _REWRITES[step] = Rewrite(step, order, fixes, code, plan, doc)
        enter_step(step, StepCodes(fixes, code))
        return plan

    return register


def registered() -> list[Rewrite]:
    """The rewrites registered so far, in planning order (``mnify.converter.steps`` imports
    every module that registers one first)."""
    return sorted(_REWRITES.values(), key=lambda r: (r.order, r.step))
