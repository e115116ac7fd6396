"""Text that ranks and mpiexec print, shared by the launcher's unit tests."""

from __future__ import annotations

from mnify.runtime.errors import CollectiveTimeout

PLAIN = [
    "Traceback (most recent call last):",
    '  File "train.py", line 12, in <module>',
    "    main()",
    '  File "train.py", line 9, in main',
    "    raise ValueError('bad lr')",
    "ValueError: bad lr",
]
TIMEOUT_TEXT = str(CollectiveTimeout("allreduce", 3, 0, 2.0, [1]))


OMPI5_SIGNAL = """--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 15613 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------"""
OMPI4_SIGNAL = (
    "mpirun noticed that process rank 0 with PID 0 on node g0034 exited on signal 6 (Aborted)."
)
OMPI5_EXIT = """prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-15629@1,2]
   Exit code:    3"""
OMPI4_EXIT = """mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[12345,1],1]
  Exit code:    7"""
OMPI_ABORT = """MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD
  Proc: [[34922,1],1]
  Errorcode: 4"""
MPICH_BAD = """===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 2 PID 4242 RUNNING AT node3
=   KILLED BY SIGNAL: 9 (Killed)
==================================================================================="""


MPICH5_KILLED = """===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 4462 RUNNING AT vm
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
This typically refers to a problem with your application."""
MPICH_ABORT = (
    "Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1)"
    " - process 1"
)
