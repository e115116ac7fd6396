"""Rank script: the multi-node checkpointer saves per rank, keeps generations, resumes in step.

A run checkpoints every iteration and fails at iteration 5; the newest checkpoint of the last
rank is then deleted (as if that rank died before writing it), so a fresh job must resume from
iteration 4 on every rank, with the parameters it had there, and clean up after finishing.
"""

from __future__ import annotations

import os
from typing import Any

import chainer
import chainer.links as L
import numpy as np

from mnify.runtime.datasets.scatter_dataset import scatter_dataset
from mnify.runtime.extensions.checkpoint import create_multi_node_checkpointer
from mnify.runtime.optimizers import create_multi_node_optimizer
from tests.support.rank_checks import assert_close, make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size
out = os.path.join(os.getcwd(), "result")  # the same directory for every rank


class Failure(RuntimeError):
    pass


def make_trainer(seed: int, stop: int) -> tuple[Any, Any, Any, dict[int, Any]]:
    np.random.seed(seed + rank)
    model = L.Classifier(L.Linear(4, 3))
    optimizer = create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), comm)
    optimizer.setup(model)
    data = None
    if rank == 0:
        rng = np.random.RandomState(0)
        data = chainer.datasets.TupleDataset(
            rng.randn(40, 4).astype(np.float32), rng.randint(0, 3, 40).astype(np.int32)
        )
    train = scatter_dataset(data, comm, shuffle=True, seed=1)
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator(train, 4, shuffle=False), optimizer
    )
    trainer = chainer.training.Trainer(updater, (stop, "iteration"), out=out)
    checkpointer = create_multi_node_checkpointer("run", comm, cp_interval=2, gc_interval=2)
    trainer.extend(checkpointer, trigger=(1, "iteration"))
    history: dict[int, Any] = {}

    @chainer.training.make_extension(trigger=(1, "iteration"), priority=-1000)
    def record(trainer: Any) -> None:
        history[trainer.updater.iteration] = model.predictor.W.array.copy()

    trainer.extend(record)
    return trainer, optimizer, checkpointer, history


def own_checkpoints() -> list[int]:
    prefix = f"run.{rank}."
    return sorted(int(f[len(prefix) :]) for f in os.listdir(out) if f.startswith(prefix))


trainer, optimizer, checkpointer, history = make_trainer(seed=10, stop=10)


@chainer.training.make_extension(trigger=(1, "iteration"), priority=-2000)
def fail_at_five(trainer: Any) -> None:
    if trainer.updater.iteration == 5:
        raise Failure("simulated crash")


trainer.extend(fail_at_five)
try:
    trainer.run(show_loop_exception_msg=False)
except Failure:
    pass
else:
    raise AssertionError("the run should have failed at iteration 5")
assert own_checkpoints() == [3, 4, 5], own_checkpoints()  # cp_interval=2 common + the newest
assert not [f for f in os.listdir(out) if f.startswith(f"tmp-run.{rank}.")], "temporary files left"
passed("generations kept after a failed run", comm)

comm.barrier()
if rank == size - 1:
    os.remove(os.path.join(out, f"run.{rank}.5"))  # this rank died before writing step 5
comm.barrier()

trainer2, optimizer2, checkpointer2, history2 = make_trainer(seed=99, stop=6)
resumed = checkpointer2.maybe_load(trainer2, optimizer2)
assert resumed == 4, resumed
assert trainer2.updater.iteration == 4 and optimizer2.t == 4
weights = trainer2.updater.get_optimizer("main").target.predictor.W.array
assert_close("parameters after resuming", weights, history[4], rtol=0)
everyone = comm.allgather_obj(weights)
assert all(np.array_equal(w, weights) for w in everyone), "ranks resumed with different weights"
passed("resumes from the newest iteration every rank has", comm)

trainer2.run()
assert trainer2.updater.iteration == 6
assert own_checkpoints() == [], own_checkpoints()  # finished normally: cleaned up
assert "avg=" in checkpointer2.get_stats()
passed("a finished run removes its checkpoints", comm)

trainer3, optimizer3, checkpointer3, _ = make_trainer(seed=5, stop=1)
assert checkpointer3.maybe_load(trainer3, optimizer3) is None
assert trainer3.updater.iteration == 0
passed("nothing to resume from", comm)
