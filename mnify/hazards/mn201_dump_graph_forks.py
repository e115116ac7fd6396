"""MN201 ``dump-graph-forks``: DumpGraph starts a subprocess (fork) inside an MPI job.

Its documentation (docs/rules.md, ``mnify explain MN201``) is generated from the rule class below.
Fixture: fixtures/lint/MN201.py.

Family: MN2xx: fork under MPI. Open MPI's registered memory does not survive ``fork()``: a child
process can corrupt the parent's buffers, and the job dies with ``mpirun noticed that process rank
0 ... exited on signal 6 (Aborted)`` or hangs.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import Rule


class DumpGraphUnderMpi(Rule):
    """Fires on every ``extensions.DumpGraph(...)`` or ``extensions.dump_graph(...)`` call (any
    import style) in a training script, guarded by a rank check or not: the rank that runs it
    still forks."""

    code = "MN201"
    name = "dump-graph-forks"
    summary = "DumpGraph starts a subprocess (fork) inside an MPI job"
    why = (
        "DumpGraph shells out (graphviz) through subprocess, which forks the MPI process; under "
        "Open MPI the job aborts with signal 6 or corrupts memory. Dump the graph in a "
        "single-process run with small data instead."
    )
    bad = "trainer.extend(extensions.DumpGraph('main/loss'))\n"
    good = "# dump the graph from a single-process run, not from the MPI job\n"

    def visit_Call(self, node: cst.Call) -> None:
        if any(N.is_dump_graph(name) for name in self.ctx.callee_names(node)):
            self.report(node)
