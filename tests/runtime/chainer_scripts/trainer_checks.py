"""Rank script: ``distribute_trainers`` makes a library helper's Trainer data-parallel at run time.

``run_train`` below is written the way a domain library writes it: it builds its own optimizer,
iterators, Trainer and extensions from what it is given and runs them; nothing in it knows about
ranks. The reference is the same helper in one process (run before ``distribute_trainers``, so
nothing is installed yet) at the combined batch. Its dataset holds exactly one global batch, so
every update of either run sees every example and the mean gradient is the same: parameters
must agree to float64 rounding after every epoch's update.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions

from mnify import runtime as mn
from tests.support.rank_checks import assert_close, make_comm, passed

chainer.global_config.dtype = np.dtype(np.float64)
assert not hasattr(training.Trainer.run, "_mn_distributes_trainers"), "installed on import"
comm = make_comm()
rank, size = comm.rank, comm.size
assert not hasattr(training.Trainer.run, "_mn_distributes_trainers"), "installed by the comm"
BATCH = 4  # per rank
N_TRAIN = BATCH * size  # one global batch
N_TEST = 2 * size + 1  # uneven evaluation shards


class Recorder(chainer.Chain):
    """A linear predictor that records the example ids (column 0 of x) of its training batches."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.fc = L.Linear(4, 3)
        self.seen: list[int] = []

    def forward(self, x: Any) -> Any:
        if chainer.config.train:
            self.seen.extend(int(i) for i in np.asarray(x[:, 0]))
        return self.fc(F.tanh(x))


def make_model(seed: int) -> L.Classifier:
    np.random.seed(seed)
    return L.Classifier(Recorder())


def make_data(n: int, seed: int) -> chainer.datasets.TupleDataset:
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 4)
    x[:, 0] = np.arange(n)  # the example id
    return chainer.datasets.TupleDataset(x, rng.randint(0, 3, n).astype(np.int32))


def run_train(model: Any, train: Any, valid: Any, batchsize: int, epoch: int, out: str) -> Any:
    """A library's helper: everything built here, from its arguments."""
    optimizer = chainer.optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)
    train_iter = chainer.iterators.SerialIterator(train, batchsize)
    valid_iter = chainer.iterators.SerialIterator(valid, batchsize, repeat=False, shuffle=False)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (epoch, "epoch"), out=out)
    trainer.extend(extensions.Evaluator(valid_iter, model))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(["epoch", "main/loss", "validation/main/loss"]))
    trainer.extend(extensions.snapshot_object(model, "model_epoch_{.updater.epoch}"))
    trainer.run()
    return trainer


def whole_set_loss(model: Any, data: Any) -> float:
    it = chainer.iterators.SerialIterator(data, len(data), repeat=False, shuffle=False)
    return float(extensions.Evaluator(it, model)()["main/loss"])


def params(model: Any) -> dict[str, np.ndarray]:
    return {name: p.array.copy() for name, p in sorted(model.namedparams())}


def check_library_helper() -> None:
    # the reference: one process, combined batch, rank 0's initial weights, nothing installed
    reference = make_model(seed=0)
    with tempfile.TemporaryDirectory() as ref_out:
        run_train(reference, make_data(N_TRAIN, 1), make_data(N_TEST, 2), BATCH * size, 3, ref_out)
    assert len(reference.predictor.seen) == 3 * N_TRAIN

    mn.distribute_trainers(comm)
    # the other ranks start elsewhere: the first update must broadcast rank 0's weights
    model = make_model(seed=0 if rank == 0 else 100 + rank)
    out = tempfile.mkdtemp(prefix=f"mnify-trainers-{rank}-")
    trainer = run_train(model, make_data(N_TRAIN, 1), make_data(N_TEST, 2), BATCH, 3, out)

    got, want = params(model), params(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        assert_close(f"parameter {name}", got[name], want[name], rtol=1e-10)
    # a single process at the per-rank batch ends elsewhere: the comparison can fail
    alone = make_model(seed=0)
    one = chainer.iterators.SerialIterator(make_data(BATCH, 1), BATCH)
    opt = chainer.optimizers.MomentumSGD(lr=0.1)
    opt.setup(alone)
    for _ in range(3):
        opt.update(alone, *chainer.dataset.concat_examples(one.next()))
    differs = max(float(np.max(np.abs(params(alone)[k] - want[k]))) for k in want)
    assert differs > 1e-6, differs
    passed("library helper: parameters of one process at the combined batch", comm)

    seen = model.predictor.seen
    assert len(seen) == 3 * BATCH, len(seen)  # 3 updates of the per-rank batch
    everyone = comm.allgather_obj(sorted(set(seen)))
    for other, ids in enumerate(everyone):
        if other != rank:
            assert not set(ids) & set(seen), (rank, other, set(ids) & set(seen))
    assert sorted(i for ids in everyone for i in ids) == list(range(N_TRAIN))
    passed("library helper: every rank trained on its own share, together all examples", comm)

    log = trainer.get_extension("LogReport").log
    expected = whole_set_loss(model, make_data(N_TEST, 2))
    assert_close("validation loss over the whole set", log[-1]["validation/main/loss"], expected)
    written = sorted(os.listdir(out))
    if rank == 0:
        assert "log" in written and "model_epoch_3" in written, written
    else:
        assert written == [], written
    report = mn.trainers.trainer_report(trainer)
    assert report is not None and report.needs_person == [], report
    assert report.optimizers == ["'main' (MomentumSGD)"], report.optimizers
    assert len(report.iterators) == 2 and len(report.evaluators) == 1, report
    passed(
        "library helper: whole-set evaluation, rank 1 writes nothing, nothing for a person", comm
    )


class UserIterator(chainer.dataset.Iterator):  # type: ignore[misc]
    """A project's own repeating iterator: the runtime cannot know how to rebuild it."""

    def __init__(self, dataset: Any, batch_size: int) -> None:
        self.dataset, self.batch_size, self.epoch, self.is_new_epoch = dataset, batch_size, 0, False
        self.position = 0

    def __next__(self) -> Any:
        batch = [self.dataset[(self.position + i) % len(self.dataset)] for i in range(BATCH)]
        self.position += BATCH
        self.is_new_epoch = self.position >= len(self.dataset)
        if self.is_new_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        return batch

    @property
    def epoch_detail(self) -> float:
        return self.epoch + self.position / len(self.dataset)


def trainer_over(iterator: Any, model: Any, optimizer: Any = None) -> Any:
    if optimizer is None:
        optimizer = chainer.optimizers.SGD()
        optimizer.setup(model)
    updater = training.updaters.StandardUpdater(iterator, optimizer)
    return training.Trainer(updater, (1, "iteration"), out=tempfile.mkdtemp())


def check_reports_and_idempotence() -> None:
    mn.distribute_trainers(comm)  # again: Trainer.run stays wrapped once
    assert not hasattr(training.Trainer.run.__wrapped__, "_mn_distributes_trainers")

    model = make_model(seed=0)
    trainer = trainer_over(UserIterator(make_data(N_TRAIN, 1), BATCH), model)
    trainer.run()
    report = mn.trainers.trainer_report(trainer)
    assert report is not None and len(report.needs_person) == 1, report
    assert "UserIterator" in report.needs_person[0] and "whole dataset" in report.needs_person[0]
    assert trainer.updater.get_iterator("main").dataset is not None  # left as it is
    passed("an iterator of a project's own class is reported as needing a person", comm)

    # a trainer converted by hand already: its share and multi-node optimizer are left
    share = mn.scatter_dataset(make_data(N_TRAIN, 1) if rank == 0 else None, comm)
    model = make_model(seed=0)
    optimizer = mn.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
    optimizer.setup(model)
    it = chainer.iterators.MultithreadIterator(share, 2, n_threads=2, shuffle=False)
    trainer = trainer_over(it, model, optimizer)
    valid = chainer.iterators.SerialIterator(make_data(N_TEST, 2), 3, repeat=False)
    trainer.extend(mn.create_multi_node_evaluator(extensions.Evaluator(valid, model), comm))
    trainer.run()
    report = mn.trainers.trainer_report(trainer)
    assert report is not None and report.optimizers == [] and report.iterators == [], report
    assert len(report.left) == 3 and report.needs_person == [], report
    assert trainer.get_extension("validation").get_iterator("main") is valid
    assert trainer.updater.get_optimizer("main") is optimizer
    assert trainer.updater.get_iterator("main") is it
    assert mn.distribute_trainer(trainer, comm) is None  # converted once only

    # a MultithreadIterator over a whole dataset is rebuilt with its own arguments
    whole = chainer.iterators.MultithreadIterator(
        make_data(N_TRAIN, 1), 2, n_threads=2, shuffle=False
    )
    trainer = trainer_over(whole, make_model(seed=0))
    trainer.run()
    rebuilt = trainer.updater.get_iterator("main")
    assert type(rebuilt) is chainer.iterators.MultithreadIterator and rebuilt is not whole
    assert (rebuilt.n_threads, rebuilt._repeat, rebuilt.order_sampler) == (2, True, None)
    assert len(rebuilt.dataset) == N_TRAIN // size
    passed("idempotent: converted trainers, shares and multi-node optimizers are left", comm)


class TablePrinter(chainer.training.Extension):  # type: ignore[misc]
    """A library's own reporting extension, as chainer-chemistry's AutoPrintReport is written:
    it keeps the stream it was given, prints a line per epoch, and on the way halves the
    learning rate (state every rank must share, so it cannot simply be dropped elsewhere)."""

    trigger = (1, "epoch")

    def __init__(self, out: Any = sys.stdout) -> None:
        self._out = out

    def __call__(self, trainer: Any) -> None:
        optimizer = trainer.updater.get_optimizer("main")
        optimizer.lr /= 2
        self._out.write(f"table-line epoch {trainer.updater.epoch} lr {optimizer.lr}\n")
        print(f"table-print epoch {trainer.updater.epoch}")


@chainer.training.make_extension(trigger=(1, "epoch"))
def print_epoch(trainer: Any) -> None:
    """A library's function extension that prints, straight to the file descriptor too."""
    os.write(1, f"fd-line epoch {trainer.updater.epoch}\n".encode())


def check_library_extensions() -> None:
    model = make_model(seed=0)
    optimizer = chainer.optimizers.SGD(lr=0.8)
    optimizer.setup(model)
    it = chainer.iterators.SerialIterator(make_data(N_TRAIN, 1), BATCH)
    trainer = trainer_over(it, model, optimizer)
    trainer.stop_trigger = training.triggers.IntervalTrigger(2, "epoch")
    trainer.extend(TablePrinter())
    trainer.extend(print_epoch)
    trainer.run()
    lrs = comm.allgather_obj(trainer.updater.get_optimizer("main").lr)
    assert lrs == [0.2] * size, lrs  # halved twice on every rank
    assert isinstance(trainer.get_extension("TablePrinter"), TablePrinter)
    report = mn.trainers.trainer_report(trainer)
    assert report is not None and report.needs_person == [], report
    assert [q.split(" ")[0] for q in report.quiet] == ["'TablePrinter'", "'print_epoch'"], report
    print("after the trainer: every rank prints again", flush=True)
    passed("a library's own extensions run on every rank and print on rank 0 only", comm)


check_library_helper()
check_reports_and_idempotence()
check_library_extensions()
