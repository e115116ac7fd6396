"""distribute_trainers on 2 and 3 ranks: a library helper's Trainer made data-parallel at run time."""

from __future__ import annotations

import chainer
import numpy as np
import pytest

from mnify.runtime import trainers
from tests.runtime.chainer_scripts.launch import run_script
from tests.support.mpirun import run_ranks

CHECKS = [
    "library helper: parameters of one process at the combined batch",
    "library helper: every rank trained on its own share, together all examples",
    "library helper: whole-set evaluation, rank 1 writes nothing, nothing for a person",
    "an iterator of a project's own class is reported as needing a person",
    "idempotent: converted trainers, shares and multi-node optimizers are left",
    "a library's own extensions run on every rank and print on rank 0 only",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [2, 3])
def test_distribute_trainers(n_ranks: int) -> None:
    run = run_script(n_ranks, "trainer_checks.py", CHECKS)
    summaries = [line for line in run.rank_lines(0) if "distribute_trainers:" in line]
    assert len(summaries) == 5, summaries  # one per trainer that ran, on rank 0
    for rank in range(1, n_ranks):
        assert not [line for line in run.rank_lines(rank) if line.startswith("mnify:")]
    for rank in range(n_ranks):
        lines = run.rank_lines(rank)
        printed = [line for line in lines if line.startswith(("table-", "fd-line"))]
        assert len(printed) == (6 if rank == 0 else 0), (rank, printed)
        assert "after the trainer: every rank prints again" in lines, (rank, lines[-5:])


@pytest.mark.mpi
def test_rank_0_says_when_no_trainer_ran() -> None:
    """A run that trains without a Trainer is not reached; rank 0 says so at exit."""
    script = (
        "from mnify import runtime as mn\n"
        "comm = mn.create_communicator('naive')\n"
        "mn.distribute_trainers(comm)\n"
        "print('a hand-written loop would run here', flush=True)\n"
    )
    run = run_ranks(2, script, timeout=120)
    said = [
        [line for line in run.rank_lines(r) if "no chainer.training.Trainer ran" in line]
        for r in range(2)
    ]
    assert [len(s) for s in said] == [1, 0], run.describe()


def test_multiprocess_iterator_is_rebuilt_with_its_own_arguments() -> None:
    data = list(range(10))
    sampler = chainer.iterators.ShuffleOrderSampler(np.random.RandomState(3))
    it = chainer.iterators.MultiprocessIterator(
        data,
        2,
        repeat=False,
        n_processes=2,
        n_prefetch=3,
        shared_mem=1 << 20,
        order_sampler=sampler,
        dataset_timeout=5.0,
        maxtasksperchild=7,
    )
    try:
        kwargs = trainers._constructor_arguments(it)
    finally:
        it.finalize()
    assert kwargs == {
        "repeat": False,
        "n_processes": 2,
        "n_prefetch": 3,
        "shared_mem": 1 << 20,
        "dataset_timeout": 5.0,
        "maxtasksperchild": 7,
        "order_sampler": sampler,
    }
    unshuffled = chainer.iterators.SerialIterator(data, 2, shuffle=False)
    assert trainers._constructor_arguments(unshuffled) == {"repeat": True, "shuffle": False}


def test_nothing_is_installed_until_distribute_trainers_is_called() -> None:
    from mnify import runtime as mn

    assert mn.distribute_trainers is trainers.distribute_trainers
    assert not hasattr(chainer.training.Trainer.run, trainers._WRAPPED)


@pytest.mark.mpi
def test_quiet_on_other_ranks_as_the_converter_writes_it() -> None:
    """``trainer.extend(mn.quiet_on_other_ranks(Ext(), comm))`` without distribute_trainers:
    the extension runs on every rank (its counter moves everywhere) and prints on rank 0."""
    script = (
        "import sys, chainer, numpy as np\n"
        "from chainer import training\n"
        "from mnify import runtime as mn\n"
        "comm = mn.create_communicator('naive')\n"
        "class Report(training.Extension):\n"
        "    trigger = (1, 'iteration')\n"
        "    def __init__(self, out=sys.stdout):\n"
        "        self.out, self.calls = out, 0\n"
        "    def __call__(self, trainer):\n"
        "        self.calls += 1\n"
        "        self.out.write(f'report-line {self.calls}\\n')\n"
        "model = chainer.links.Linear(2, 1)\n"
        "opt = chainer.optimizers.SGD()\n"
        "opt.setup(model)\n"
        "it = chainer.iterators.SerialIterator([(np.ones(2, np.float32),)] * 4, 2)\n"
        "upd = training.updaters.StandardUpdater(it, opt, loss_func=lambda x: chainer.functions.sum(model(x)))\n"
        "trainer = training.Trainer(upd, (3, 'iteration'), out='/tmp')\n"
        "report = Report()\n"
        "trainer.extend(mn.quiet_on_other_ranks(report, comm))\n"
        "trainer.run()\n"
        "print('calls', report.calls, isinstance(report, Report), flush=True)\n"
    )
    run = run_ranks(2, script, timeout=120)
    for rank in range(2):
        lines = run.rank_lines(rank)
        printed = [line for line in lines if line.startswith("report-line")]
        assert len(printed) == (3 if rank == 0 else 0), (rank, run.describe())
        assert "calls 3 True" in lines, run.describe()
