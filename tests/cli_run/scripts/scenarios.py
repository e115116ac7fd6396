"""Rank behaviours for the ``mnify run`` tests: ``python scenarios.py SCENARIO [ARGS]``.

ok          every rank prints a line to stdout and one to stderr, and ends cleanly
raise_all   every rank raises the same error after a barrier
raise_one   rank 1 raises, the others wait in a collective
plain_one   like raise_one without the mnify runtime (plain mpi4py, no failure hook)
sleep_one   rank 1 sleeps, the others time out in an allreduce (needs MNIFY_WATCHDOG_TIMEOUT)
handled     rank 0 prints a handled traceback, carries on for a while, and every rank succeeds
hosts [fail] every rank prints its host; with "fail" the last rank raises afterwards
wait        every rank prints "ready R" and sleeps 60 s (to be interrupted)
exit_code N rank 1 calls sys.exit(N), the others wait in a collective
exit_early  rank 1 ends its script (status 0), the others wait in a collective
exit_then_enter  rank 1 ends its script; the others work alone 5 s, then enter a collective
tail        after a last barrier rank 0 works alone for 6 s (a post-training tail); success
kill_one    rank 1 kills itself with SIGKILL, the others wait in a collective
kill_late   the others end their scripts; 3 s later rank 1 kills itself with SIGKILL (the
            finalize-fence race: a rank dying while the others are on their way out)
stop_one    rank 1 stops itself with SIGSTOP, the others wait in a collective (needs the watchdog)
loop_one    rank 1 loops forever in Python, the others wait in a collective (needs the watchdog)
shapes      rank 1 passes one more element than the others to an allreduce
train_raise_all  a Chainer Trainer whose extension raises on every rank
train_sleep_one  a Chainer Trainer whose extension sleeps on rank 1 (needs the watchdog)

Failing scenarios print ``FAILING <unix time>`` on stdout at the moment of the failure, so the
tests can measure how long the job takes to end after it.
"""

import os
import signal
import sys
import time

scenario = sys.argv[1]


def failing() -> None:
    print(f"FAILING {time.time():.3f}", flush=True)


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
if scenario.startswith("train_"):
    import numpy as np
    from chainer import datasets, iterators, links, optimizers, training

    from mnify import runtime as mn

    comm = mn.create_communicator("naive")
    model = links.Classifier(links.Linear(3, 2))
    optimizer = mn.create_multi_node_optimizer(optimizers.SGD(), comm)
    optimizer.setup(model)
    x = np.random.rand(16, 3).astype(np.float32)
    t = (x[:, 0] > 0.5).astype(np.int32)
    it = iterators.SerialIterator(datasets.TupleDataset(x, t), 4)
    trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer), (4, "iteration"))

    @training.make_extension(trigger=(2, "iteration"))
    def misbehave(_: training.Trainer) -> None:
        if scenario == "train_raise_all":
            failing()
            raise ValueError("learning rate must be positive")
        if scenario == "train_sleep_one" and comm.rank == 1:
            failing()
            time.sleep(60)

    trainer.extend(misbehave)
    trainer.run()
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
    failing()
    raise ValueError("learning rate must be positive")
elif scenario == "raise_one":
    comm.barrier()
    if comm.rank == 1:
        failing()
        raise KeyError(f"no shard for rank {comm.rank}")
    comm.allreduce(np.ones(2))
elif scenario == "sleep_one":
    comm.barrier()
    if comm.rank == 1:
        failing()
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
elif scenario in ("exit_code", "exit_early", "exit_then_enter", "kill_one", "stop_one", "loop_one"):
    comm.barrier()
    if comm.rank == 1:
        failing()
        if scenario == "kill_one":
            os.kill(os.getpid(), signal.SIGKILL)
        if scenario == "stop_one":
            os.kill(os.getpid(), signal.SIGSTOP)
        while scenario == "loop_one":
            pass
        sys.exit(int(sys.argv[2]) if scenario == "exit_code" else 0)
    if scenario == "exit_then_enter":
        time.sleep(5)  # local work: never stopped, however long
    comm.allreduce(np.ones(2))
elif scenario == "kill_late":
    comm.barrier()
    if comm.rank == 1:
        time.sleep(3)
        failing()
        os.kill(os.getpid(), signal.SIGKILL)
elif scenario == "tail":
    comm.barrier()
    if comm.rank == 0:
        time.sleep(6)  # e.g. evaluating the full test set on rank 0 alone
        print("tail done", flush=True)
elif scenario == "shapes":
    comm.barrier()
    if comm.rank == 1:
        failing()
    comm.allreduce(np.ones(4 + (comm.rank == 1), dtype=np.float32))
else:
    raise SystemExit(f"unknown scenario {scenario}")
