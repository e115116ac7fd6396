"""abort_job ends the process even when MPI_Abort hangs (seen with Open MPI 5)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.mpirun import mpi_env

HANGING_ABORT = textwrap.dedent(
    """
    import time
    import types

    import mpi4py

    # An MPI whose Abort never returns, the way Open MPI 5's sometimes does not.
    world = types.SimpleNamespace(Get_size=lambda: 2, Abort=lambda code: time.sleep(600))
    mpi4py.MPI = types.SimpleNamespace(
        Is_initialized=lambda: True, Is_finalized=lambda: False, COMM_WORLD=world
    )

    from mnify.runtime.abort import abort_job

    print("aborting", flush=True)
    abort_job(3)
    """
)


def test_a_hanging_mpi_abort_still_ends_the_process() -> None:
    env = mpi_env({"MNIFY_ABORT_FALLBACK": "1"})
    done = subprocess.run(
        [sys.executable, "-c", HANGING_ABORT], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "aborting", done.stderr
    assert done.returncode != 0
