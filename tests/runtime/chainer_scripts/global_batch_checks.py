"""Rank script (3 ranks): global-batch training equals one process with the same global batch.

One launch runs every case; ranks form sub-communicators (``comm.split``) for the cases of 1 and
2 ranks, so a snapshot written by 1 or 2 ranks is resumed by 2, 1 or 3 in the same job. Each
participating rank writes ``<case>.<phase>.n<ranks>.r<rank>.json`` into the working directory: the
largest relative difference of its parameters (and batch-norm statistics) from one process, and
its ledger -- ``[iteration, rank, example indices]`` for every example it read, which with a
global-batch iterator is exactly what it trained on. The pytest side
(tests/runtime/test_global_batch.py) merges the ledgers of all ranks and phases.

The model: Linear -> batch norm -> relu -> Linear, float64, MultiNodeBatchNormalization on the
ranks (plain BatchNormalization in the reference), MomentumSGD, Chainer's StandardUpdater and
Trainer on both sides. The reference is Chainer's SerialIterator with the global batch and an
order sampler drawing the same per-epoch permutations.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn
from mnify.runtime.iterators.global_batch_iterator import epoch_order
from tests.support.rank_checks import make_comm, passed

chainer.global_config.dtype = np.dtype(np.float64)
world = make_comm()
rank, size = world.rank, world.size
assert size == 3, "this script needs 3 ranks"
OUT = os.getcwd()
SEED = 5


class MLP(chainer.Chain):
    """Linear -> BN -> relu -> Linear; ``slow_per_example`` seconds of sleep per example."""

    def __init__(self, bn: Callable[[int], chainer.Link], slow_per_example: float = 0.0) -> None:
        super().__init__()
        self.slow_per_example = slow_per_example
        with self.init_scope():
            self.l1 = L.Linear(5, 6)
            self.bn = bn(6)
            self.l2 = L.Linear(6, 3)

    def forward(self, x: Any) -> Any:
        if self.slow_per_example:
            time.sleep(self.slow_per_example * len(x))
        return self.l2(F.relu(self.bn(self.l1(x))))


def make_data(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(n)
    return rng.randn(n, 5), rng.randint(0, 3, n).astype(np.int32)


class LedgerDataset(chainer.dataset.DatasetMixin):  # type: ignore[misc]
    """The whole dataset; records which examples this rank read at which iteration."""

    def __init__(self, n: int) -> None:
        self.x, self.t = make_data(n)
        self.iterator: Any = None
        self.ledger: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.x)

    def get_example(self, i: int) -> tuple[np.ndarray, np.int32]:
        self.ledger.setdefault(int(self.iterator.iteration), []).append(int(i))
        return self.x[i], self.t[i]


class EpochSampler:
    """The reference's order sampler: its k-th call gives epoch k's permutation."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, order: Any, position: int) -> np.ndarray:
        order = epoch_order(SEED, self.calls, self.n)
        self.calls += 1
        return order


def state_of(model: chainer.Link) -> dict[str, np.ndarray]:
    found = {name: np.array(p.array) for name, p in model.namedparams()}
    for path, link in model.namedlinks():
        for name in ("avg_mean", "avg_var"):
            if hasattr(link, name):
                found[f"{path}/{name}"] = np.array(getattr(link, name))
    return found


def max_relative_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest difference of an array relative to its largest expected value -- or to 1e-3 of
    the model's largest value, for arrays that are all but zero (the bias before batch norm:
    its exact gradient is zero, so both sides hold rounding noise of ~1e-18)."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    floor = 1e-3 * max(float(np.max(np.abs(v))) for v in b.values())
    worst = 0.0
    for key in b:
        scale = max(float(np.max(np.abs(b[key]))), floor, 1e-300)
        worst = max(worst, float(np.max(np.abs(a[key] - b[key]))) / scale)
    return worst


_references: dict[tuple[int, int, int, bool], dict[str, np.ndarray]] = {}


def reference(n: int, batch: int, iterations: int, repeat: bool = True) -> dict[str, np.ndarray]:
    """One process, Chainer's own iterator with the global batch; cached per configuration."""
    key = (n, batch, iterations, repeat)
    if key not in _references:
        np.random.seed(100)
        model = L.Classifier(MLP(lambda c: L.BatchNormalization(c, decay=0.8)))
        opt = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
        opt.setup(model)
        x, t = make_data(n)
        it = chainer.iterators.SerialIterator(
            chainer.datasets.TupleDataset(x, t), batch, repeat=repeat, order_sampler=EpochSampler(n)
        )
        if repeat:
            updater = chainer.training.StandardUpdater(it, opt)
            chainer.training.Trainer(updater, (iterations, "iteration"), out=OUT).run()
        else:
            for batch_examples in it:
                opt.update(model, *chainer.dataset.concat_examples(batch_examples))
        _references[key] = state_of(model)
    return _references[key]


def sub_comm(members: list[int]) -> Any:
    """A communicator over ``members`` (collective over the world); None on the others."""
    sub = world.split(0 if rank in members else 1, rank)
    return sub if rank in members else None


class Run:
    """One training job on ``comm``: global-batch iterator, MNBN, multi-node optimizer."""

    def __init__(
        self,
        comm: Any,
        n: int,
        batch: int,
        stop: int,
        split: Any = "even",
        slow_rank: int | None = None,
        snapshot_at: int | None = None,
    ) -> None:
        self.comm = comm
        np.random.seed(100 + comm.rank)  # different starting points: the optimizer broadcasts
        slow = 0.03 if comm.rank == slow_rank else 0.0
        self.model = L.Classifier(
            MLP(lambda c: mn.links.MultiNodeBatchNormalization(c, comm, decay=0.8), slow)
        )
        opt = mn.create_multi_node_optimizer(
            chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9), comm
        )
        opt.setup(self.model)
        self.data = LedgerDataset(n)
        self.iterator = mn.create_global_batch_iterator(
            self.data, batch, comm, seed=SEED, split=split
        )
        self.data.iterator = self.iterator
        updater = chainer.training.StandardUpdater(self.iterator, opt)
        self.trainer = chainer.training.Trainer(updater, (stop, "iteration"), out=OUT)
        self.shares: list[list[int]] = []

        @chainer.training.make_extension(trigger=(1, "iteration"))
        def record_shares(trainer: Any) -> None:
            self.shares.append(list(self.iterator.shares))

        self.trainer.extend(record_shares)
        if snapshot_at is not None:
            self.trainer.extend(
                mn.extensions.global_snapshot(filename="snapshot_{.updater.iteration}", comm=comm),
                trigger=(snapshot_at, "iteration"),
            )

    def report(self, case: str, phase: str, expected: dict[str, np.ndarray], **extra: Any) -> None:
        ledger = [[it, self.comm.rank, idx] for it, idx in sorted(self.data.ledger.items())]
        result = {
            "case": case,
            "ranks": self.comm.size,
            "max_rel_diff": max_relative_difference(state_of(self.model), expected),
            "ledger": ledger,
            **extra,
        }
        name = f"{case}.{phase}.n{self.comm.size}.r{self.comm.rank}.json"
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as stream:
            json.dump(result, stream)


N_TRAIN, BATCH, STOP, SNAP = 23, 6, 10, 5  # the snapshot at 30 examples: epoch 1, position 7


def train_case(case: str, members: list[int], batch: int = BATCH, **options: Any) -> Run | None:
    comm = sub_comm(members)
    run = None
    if comm is not None:
        run = Run(comm, N_TRAIN, batch, STOP, **options)
        run.trainer.run()
        run.report(case, "all", reference(N_TRAIN, batch, STOP), shares=run.shares, batch=batch)
    world.barrier()
    return run


train_case("even", [0, 1])
train_case("even", [0, 1, 2])
passed("even split on 2 and 3 ranks", world)

train_case("uneven", [0, 1, 2], split=[1, 3, 2])
passed("a fixed uneven split", world)

# a larger global batch: a step's fixed costs, spread over more examples, blur speeds less
speed = train_case("speed", [0, 1, 2], batch=12, split="speed", slow_rank=1)
assert speed is not None
histories = world.allgather_obj(speed.shares)
assert all(h == histories[0] for h in histories), "ranks disagree on the shares"
passed("split=speed with one rank slowed", world)


def snapshot_then_resume(case: str, writers: list[int], readers: list[int]) -> None:
    """``writers`` train to SNAP and snapshot; ``readers`` resume from it and finish."""
    comm = sub_comm(writers)
    path = os.path.join(OUT, f"snapshot_{SNAP}")
    if comm is not None:
        run = Run(comm, N_TRAIN, BATCH, SNAP, snapshot_at=SNAP)
        run.trainer.run()
        run.report(case, "first", reference(N_TRAIN, BATCH, SNAP))
        written = run.trainer.get_extension("GlobalSnapshot").written
        assert written == ([path] if comm.rank == 0 else []), written
        if comm.rank == 0:
            os.replace(path, os.path.join(OUT, f"{case}.npz"))
    world.barrier()
    comm = sub_comm(readers)
    if comm is not None:
        run = Run(comm, N_TRAIN, BATCH, STOP)
        mn.load_global_snapshot(os.path.join(OUT, f"{case}.npz"), run.trainer)
        assert run.trainer.updater.iteration == SNAP
        assert run.iterator.epoch == 1 and run.iterator.current_position == 7
        run.trainer.run()
        run.report(case, "resumed", reference(N_TRAIN, BATCH, STOP))
    world.barrier()


snapshot_then_resume("resume_1_to_2", [0], [0, 1])
snapshot_then_resume("resume_2_to_1", [0, 1], [2])
snapshot_then_resume("resume_2_to_3", [1, 2], [0, 1, 2])
passed("resume 1->2, 2->1, 2->3 from a snapshot taken mid-epoch", world)


def repeat_false_with_an_empty_share() -> None:
    """10 examples, global batch 4, 3 ranks: the last batch (2) leaves rank 2 empty. A hand loop
    trains on it (the empty rank joins every collective with zero-length arrays) and the
    multi-node evaluator counts each example once."""
    n, batch = 10, 4
    np.random.seed(100 + rank)
    model = L.Classifier(MLP(lambda c: mn.links.MultiNodeBatchNormalization(c, world, decay=0.8)))
    opt = mn.create_multi_node_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), world)
    opt.setup(model)
    data = LedgerDataset(n)
    it = mn.create_global_batch_iterator(data, batch, world, repeat=False, seed=SEED)
    data.iterator = it
    observed: list[dict[str, Any]] = []
    for examples in it:
        if examples:
            x, t = chainer.dataset.concat_examples(examples)
        else:  # this rank's share is empty: it still takes part, with no examples
            x, t = np.zeros((0, 5)), np.zeros(0, np.int32)
        observation: dict[str, Any] = {}
        reporter = chainer.Reporter()
        reporter.add_observer("main", model)
        with reporter.scope(observation):
            opt.update(model, x, t)
        observed.append({k: float(v.array) for k, v in observation.items()})
    assert it.shares == [1, 1, 0], it.shares
    if rank == 2:  # its empty share reported nothing, so no mean counts it
        assert observed[-1] == {}, observed[-1]
    else:
        assert sorted(observed[-1]) == ["main/accuracy", "main/loss"], observed[-1]
    expected = reference(n, 4, 0, repeat=False)
    train_result = max_relative_difference(state_of(model), expected)
    train_ledger = [[k, rank, v] for k, v in sorted(data.ledger.items())]

    # evaluation: repeat=False again, through the multi-node evaluator
    eval_data = LedgerDataset(n)
    eval_it = mn.create_global_batch_iterator(eval_data, batch, world, repeat=False, shuffle=False)
    eval_data.iterator = eval_it
    evaluator = mn.create_multi_node_evaluator(
        chainer.training.extensions.Evaluator(eval_it, model), world
    )
    result = evaluator()
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        x, t = make_data(n)
        y = model.predictor(x)
        want = {
            "main/loss": float(F.softmax_cross_entropy(y, t).array),
            "main/accuracy": float(F.accuracy(y, t).array),
        }
    eval_diff = max(abs(result[k] - want[k]) / max(abs(want[k]), 1e-300) for k in want)
    eval_ledger = [[k, rank, v] for k, v in sorted(eval_data.ledger.items())]
    with open(
        os.path.join(OUT, f"repeat_false.all.n{size}.r{rank}.json"), "w", encoding="utf-8"
    ) as f:
        json.dump(
            {
                "case": "repeat_false",
                "ranks": size,
                "max_rel_diff": train_result,
                "ledger": train_ledger,
                "eval_rel_diff": eval_diff,
                "eval_ledger": eval_ledger,
                "last_observed": observed[-1],
            },
            f,
        )


repeat_false_with_an_empty_share()
passed(
    "repeat=False: an empty share joins every collective, evaluation counts each example once",
    world,
)


def error_of(action: Callable[[], Any]) -> str:
    try:
        action()
    except ValueError as error:
        return str(error)
    raise AssertionError("expected a ValueError")


def bad_inputs() -> None:
    errors: dict[str, str] = {}
    errors["lengths"] = error_of(
        lambda: mn.create_global_batch_iterator(list(range(10 + (rank == 2))), 6, world)
    )
    errors["batch"] = error_of(lambda: mn.create_global_batch_iterator(list(range(10)), 2, world))
    other = Run(world, N_TRAIN + 1, BATCH, STOP)
    errors["snapshot_length"] = error_of(
        lambda: mn.load_global_snapshot(os.path.join(OUT, "resume_2_to_3.npz"), other.trainer)
    )
    world.barrier()
    # per-rank checkpoints of 2 ranks, then a 3-rank job trying to resume them
    pair = sub_comm([0, 1])
    checkpoints = os.path.join(OUT, "checkpoints")
    if pair is not None:
        run = Run(pair, N_TRAIN, BATCH, 2)
        checkpointer = mn.create_multi_node_checkpointer("run", pair, path=checkpoints)
        run.trainer.extend(checkpointer, trigger=(1, "iteration"))
        checkpointer._failed = True  # keep them after the run, as after a crash
        run.trainer.run()
    world.barrier()
    again = Run(world, N_TRAIN, BATCH, STOP)
    checkpointer = mn.create_multi_node_checkpointer("run", world, path=checkpoints)
    errors["checkpointer_size"] = error_of(lambda: checkpointer.maybe_load(again.trainer))
    errors["per_rank_file"] = error_of(
        lambda: mn.load_global_snapshot(os.path.join(checkpoints, "run.0.2"), again.trainer)
    )
    with open(os.path.join(OUT, f"errors.all.n{size}.r{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(errors, f)


bad_inputs()
passed("bad input: clear errors on every rank", world)
