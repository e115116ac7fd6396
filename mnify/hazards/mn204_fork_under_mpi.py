"""MN204 ``fork-under-mpi``: os.fork() inside an MPI job.

Its documentation (docs/rules.md, ``mnify explain MN204``) is generated from the rule class below.
Fixture: fixtures/lint/MN204.py.

Family: MN2xx: fork under MPI. Open MPI's registered memory does not survive ``fork()``: a child
process can corrupt the parent's buffers, and the job dies with ``mpirun noticed that process rank
0 ... exited on signal 6 (Aborted)`` or hangs.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import Rule


class ForkUnderMpi(Rule):
    """Fires on ``os.fork()``, ``os.forkpty()`` and ``pty.fork()`` in a training script."""

    code = "MN204"
    name = "fork-under-mpi"
    summary = "os.fork() inside an MPI job"
    why = (
        "A forked child shares the parent's MPI and CUDA state; Open MPI warns, then the job "
        "aborts (signal 6), hangs, or silently corrupts data. CUDA contexts do not survive fork."
    )
    bad = "pid = os.fork()\n"
    good = "# use multiprocessing with the 'forkserver' start method, before the communicator\n"

    def visit_Call(self, node: cst.Call) -> None:
        if N.any_in(self.ctx.callee_names(node), N.FORK_CALLS):
            self.report(node)
