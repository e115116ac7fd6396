"""MN205 ``multiprocessing-fork-start-method``: multiprocessing uses the fork start method inside an
MPI job.

Its documentation (docs/rules.md, ``mnify explain MN205``) is generated from the rule class below.
Fixture: fixtures/lint/MN205.py.

Family: MN2xx: fork under MPI. Open MPI's registered memory does not survive ``fork()``: a child
process can corrupt the parent's buffers, and the job dies with ``mpirun noticed that process rank
0 ... exited on signal 6 (Aborted)`` or hangs.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import Rule
from mnify.hazards.start_method import start_method
from mnify.program.context import LintContext

_SAFE_START_METHODS = ("forkserver", "spawn")


class MultiprocessingForkStartMethod(Rule):
    """Fires on ``multiprocessing.set_start_method('fork')`` and
    ``multiprocessing.get_context('fork')``, and on ``multiprocessing.Process``/``Pool``/
    ``concurrent.futures.ProcessPoolExecutor`` constructions in a script that never selects the
    'forkserver' or 'spawn' start method with ``multiprocessing.set_start_method`` (on Linux the
    default start method is fork)."""

    code = "MN205"
    name = "multiprocessing-fork-start-method"
    summary = "multiprocessing uses the fork start method inside an MPI job"
    why = (
        "With the 'fork' start method every worker is a fork of the MPI (and CUDA) process: "
        "Open MPI aborts with signal 6 or the workers hang. 'forkserver' or 'spawn' start "
        "workers from a clean process."
    )
    bad = "pool = multiprocessing.Pool(4)\n"
    good = "multiprocessing.set_start_method('forkserver')\npool = multiprocessing.Pool(4)\n"

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._safe_method_set = False
        self._constructions: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.callee_names(node)
        if not names:
            return
        method = start_method(self.ctx, node)
        if method == "fork":
            self.report(node, "the 'fork' start method forks the MPI process")
        elif method in _SAFE_START_METHODS and N.any_in(names, N.START_METHOD_SETTERS):
            self._safe_method_set = True
        elif N.any_in(names, N.PROCESS_FACTORIES):
            self._constructions.append(node)

    def finish(self) -> None:
        if self._safe_method_set:
            return
        for node in self._constructions:
            self.report(
                node,
                "worker processes are forked (the default start method); "
                "call multiprocessing.set_start_method('forkserver') first",
            )
