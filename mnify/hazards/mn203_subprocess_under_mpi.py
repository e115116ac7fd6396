"""MN203 ``subprocess-under-mpi``: starting a subprocess forks the MPI process.

Its documentation (docs/rules.md, ``mnify explain MN203``) is generated from the rule class below.
Fixture: fixtures/lint/MN203.py.

Family: MN2xx: fork under MPI. Open MPI's registered memory does not survive ``fork()``: a child
process can corrupt the parent's buffers, and the job dies with ``mpirun noticed that process rank
0 ... exited on signal 6 (Aborted)`` or hangs.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import Rule


class SubprocessUnderMpi(Rule):
    """Fires on calls that start a child process through fork/exec: ``subprocess.run``/``call``/
    ``check_call``/``check_output``/``Popen``/``getoutput``/``getstatusoutput``, ``os.system``,
    ``os.popen``, ``os.spawn*`` and ``os.posix_spawn*``, in a training script."""

    code = "MN203"
    name = "subprocess-under-mpi"
    summary = "starting a subprocess forks the MPI process"
    why = (
        "`subprocess` and `os.system` fork the calling process. Under Open MPI a fork after "
        "MPI_Init can corrupt registered memory; the job aborts (signal 6) or hangs. Run the "
        "command before MPI starts, from the launcher, or not at all."
    )
    bad = "subprocess.run(['nvidia-smi'])\n"
    good = "# run `nvidia-smi` from the job script, before mpiexec\n"

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.callee_names(node)
        if N.any_in(names, N.SUBPROCESS_CALLS):
            self.report(node, f"`{min(names & N.SUBPROCESS_CALLS)}` forks the MPI process")
