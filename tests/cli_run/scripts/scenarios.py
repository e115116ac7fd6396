"""Rank behaviours for the ``mnify run`` tests: ``python scenarios.py SCENARIO [ARGS]``.

ok          every rank prints a line to stdout and one to stderr, and ends cleanly
raise_all   every rank raises the same error after a barrier
raise_one   rank 1 raises, the others wait in a collective
plain_one   like raise_one without the mnify runtime (plain mpi4py, no failure hook)
sleep_one   rank 1 sleeps, the others time out in an allreduce (needs MNIFY_WATCHDOG_TIMEOUT)
handled     rank 0 prints a handled traceback, carries on for a while, and every rank succeeds
hosts [fail] every rank prints its host; with "fail" the last rank raises afterwards
wait        every rank prints "ready R" and sleeps 60 s (to be interrupted)
"""

import sys
import time

scenario = sys.argv[1]
if scenario == "plain_one":
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    world.Barrier()
    if world.Get_rank() == 1:
        raise LookupError("rank-specific shard is missing")
    world.Barrier()
    sys.exit(0)
if scenario == "wait":
    from mpi4py import MPI

    print(f"ready {MPI.COMM_WORLD.Get_rank()}", flush=True)
    time.sleep(60)
    sys.exit(0)

import numpy as np  # noqa: E402

from mnify import runtime as mn  # noqa: E402

comm = mn.create_communicator("naive")
if scenario == "ok":
    print(f"rank {comm.rank} of {comm.size} args={sys.argv[2:]}")
    print(f"note from rank {comm.rank}", file=sys.stderr)
    comm.barrier()
elif scenario == "raise_all":
    comm.barrier()
    raise ValueError("learning rate must be positive")
elif scenario == "raise_one":
    comm.barrier()
    if comm.rank == 1:
        raise KeyError(f"no shard for rank {comm.rank}")
    comm.allreduce(np.ones(2))
elif scenario == "sleep_one":
    comm.barrier()
    if comm.rank == 1:
        time.sleep(60)
    comm.allreduce(np.ones(2))
elif scenario == "hosts":
    from mpi4py import MPI

    print(f"rank {comm.rank} of {comm.size} on {MPI.Get_processor_name()}")
    comm.barrier()
    if sys.argv[2:] == ["fail"] and comm.rank == comm.size - 1:
        raise RuntimeError(f"no GPU {comm.intra_rank} on this node")
    comm.barrier()
elif scenario == "handled":
    if comm.rank == 0:
        import traceback

        try:
            {}["missing"]
        except KeyError:
            traceback.print_exc()
        time.sleep(1.0)
    comm.barrier()
    print(f"done {comm.rank}")
else:
    raise SystemExit(f"unknown scenario {scenario}")
