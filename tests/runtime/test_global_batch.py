"""Global-batch data parallelism: any split and any world size train exactly like one process.

One 3-rank launch (tests/runtime/chainer_scripts/global_batch_checks.py) trains every case and
writes, per rank, its parameters' largest relative difference from one process with the same
global batch, and its ledger of the examples it read at each iteration. Here the ledgers of all
ranks (and of both runs around a snapshot) are merged: every iteration once, each global batch
the one-process schedule's, every example once per epoch. Without ranks: the schedule against
Chainer's SerialIterator, the splits, and the speed split's convergence.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.chainer_scripts.launch import SCRIPTS
from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

CHECKS = [
    "even split on 2 and 3 ranks",
    "a fixed uneven split",
    "split=speed with one rank slowed",
    "resume 1->2, 2->1, 2->3 from a snapshot taken mid-epoch",
    "repeat=False: an empty share joins every collective, evaluation counts each example once",
    "bad input: clear errors on every rank",
]
N_TRAIN, BATCH, STOP, SEED = 23, 6, 10, 5  # as in the rank script


def one_process_schedule(
    n: int, batch: int, iterations: int, repeat: bool = True
) -> list[list[int]]:
    """The global batches of Chainer's SerialIterator with the rank script's epoch orders."""
    import chainer

    from mnify.runtime.iterators.global_batch_iterator import epoch_order

    calls = iter(range(10**6))
    it = chainer.iterators.SerialIterator(
        list(range(n)),
        batch,
        repeat=repeat,
        order_sampler=lambda order, position: epoch_order(SEED, next(calls), n),
    )
    return [list(b) for _, b in zip(range(iterations), it, strict=False)]


def merged_ledger(runs: list[list[dict[str, Any]]], key: str = "ledger") -> dict[int, list[int]]:
    """Iteration -> the global batch as the ranks read it (in rank order). ``runs``: each run's
    per-rank results; an iteration must come from one run only, each rank's part once."""
    parts: dict[int, dict[int, list[int]]] = defaultdict(dict)
    owner: dict[int, int] = {}
    for number, results in enumerate(runs):
        for result in results:
            for iteration, rank, indices in result[key]:
                assert owner.setdefault(iteration, number) == number, (
                    f"iteration {iteration} trained by runs {owner[iteration]} and {number}"
                )
                assert rank not in parts[iteration], f"iteration {iteration} rank {rank} twice"
                parts[iteration][rank] = indices
    return {it: [i for rank in sorted(ranks) for i in ranks[rank]] for it, ranks in parts.items()}


def check_ledger(ledger: dict[int, list[int]], n: int, batch: int, iterations: int) -> str:
    """Every iteration's global batch is one process's; every epoch uses every example once."""
    assert sorted(ledger) == list(range(1, iterations + 1)), sorted(ledger)
    expected = one_process_schedule(n, batch, iterations)
    for it in range(1, iterations + 1):
        assert ledger[it] == expected[it - 1], (it, ledger[it], expected[it - 1])
    sequence = [i for it in sorted(ledger) for i in ledger[it]]
    full_epochs = len(sequence) // n
    for e in range(full_epochs):
        assert sorted(sequence[e * n : (e + 1) * n]) == list(range(n)), f"epoch {e}"
    rest = sequence[full_epochs * n :]
    assert len(set(rest)) == len(rest), "an example twice in the unfinished epoch"
    return f"{full_epochs} epochs + {len(rest)} examples, each once"


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    workdir = tmp_path_factory.mktemp("global_batch")
    run = run_ranks(
        3,
        SCRIPTS / "global_batch_checks.py",
        timeout=300,
        env={"MNIFY_TEST_COMM": "naive"},
        cwd=workdir,
    )
    for rank in range(3):
        not_passed = missing(run.rank_lines(rank), CHECKS)
        assert not not_passed, f"rank {rank} did not pass {not_passed}\n{run.describe()}"
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(Path(workdir).glob("*.json")):
        found[path.name.rsplit(".", 3)[0]].append(json.loads(path.read_text(encoding="utf-8")))
    return found


def _by_ranks(results: list[dict[str, Any]], ranks: int) -> list[dict[str, Any]]:
    return [r for r in results if r["ranks"] == ranks]


@pytest.mark.parametrize(("case", "ranks"), [("even", 2), ("even", 3), ("uneven", 3), ("speed", 3)])
def test_training_equals_one_process(
    outcome: dict[str, list[dict[str, Any]]], case: str, ranks: int
) -> None:
    results = _by_ranks(outcome[f"{case}.all"], ranks)
    assert len(results) == ranks
    worst = max(r["max_rel_diff"] for r in results)
    assert worst <= 1e-10, worst
    batch = results[0]["batch"]
    check_ledger(merged_ledger([results]), N_TRAIN, batch, STOP)
    shares = results[0]["shares"]
    assert all(sum(s) == batch and min(s) >= 1 for s in shares), shares
    if case == "uneven":  # weights 1:3:2 of 6
        assert all(s == [1, 3, 2] for s in shares), shares
    if case == "speed":
        # rank 1 sleeps 30 ms per example, far more than the others compute, even on a loaded
        # machine: its proportional share is below 1.5, so it ends at the minimum of one
        # example. Were the time waiting in collectives counted, every rank would measure the
        # slow one's pace and the split would stay even.
        assert shares[0] == [4, 4, 4], shares
        assert shares[-1][1] == 1, shares


@pytest.mark.parametrize("case", ["resume_1_to_2", "resume_2_to_1", "resume_2_to_3"])
def test_resume_at_another_size(outcome: dict[str, list[dict[str, Any]]], case: str) -> None:
    first, resumed = outcome[f"{case}.first"], outcome[f"{case}.resumed"]
    writers, readers = {r["ranks"] for r in first}, {r["ranks"] for r in resumed}
    assert (writers, readers) == {
        "resume_1_to_2": ({1}, {2}),
        "resume_2_to_1": ({2}, {1}),
        "resume_2_to_3": ({2}, {3}),
    }[case]
    worst = max(r["max_rel_diff"] for r in resumed)
    assert worst <= 1e-10, worst
    assert max(r["max_rel_diff"] for r in first) <= 1e-10
    ledger = merged_ledger([first, resumed])
    check_ledger(ledger, N_TRAIN, BATCH, STOP)


def test_repeat_false_with_an_empty_share(outcome: dict[str, list[dict[str, Any]]]) -> None:
    results = outcome["repeat_false.all"]
    assert len(results) == 3
    assert max(r["max_rel_diff"] for r in results) <= 1e-10
    train = merged_ledger([results])
    assert [len(train[i]) for i in sorted(train)] == [4, 4, 2]
    assert sorted(i for b in train.values() for i in b) == list(range(10))
    assert train == dict(enumerate(one_process_schedule(10, 4, 3, repeat=False), start=1))
    assert {r["ranks"] for r in results} == {3}
    assert [r["last_observed"] for r in results][2] == {}
    assert max(r["eval_rel_diff"] for r in results) <= 1e-10
    evaluated = merged_ledger([results], "eval_ledger")
    assert [i for b in evaluated.values() for i in b] == list(range(10))


def test_bad_input_gets_a_clear_error_on_every_rank(
    outcome: dict[str, list[dict[str, Any]]],
) -> None:
    per_rank = outcome["errors.all"]
    assert len(per_rank) == 3
    for errors in per_rank:
        assert "rank 0: 10, rank 1: 10, rank 2: 11" in errors["lengths"]
        assert "global batch (2) is smaller than the number of ranks (3)" in errors["batch"]
        assert "23 examples" in errors["snapshot_length"]
        assert "has 24" in errors["snapshot_length"]
        assert "written by 2 ranks; this job has 3" in errors["checkpointer_size"]
        assert "global_snapshot" in errors["checkpointer_size"]
        assert "not a global snapshot" in errors["per_rank_file"]


# -- without ranks ------------------------------------------------------------------------------


class _OneRank:
    """What the iterator asks of a communicator, for one process."""

    rank, size = 0, 1

    def allgather_obj(self, obj: Any) -> list[Any]:
        return [obj]


@pytest.mark.parametrize(
    ("n", "batch", "repeat", "shuffle"),
    [(10, 3, True, True), (10, 4, False, True), (7, 7, True, False), (5, 12, True, True)],
)
def test_one_rank_iterates_like_serial_iterator(
    n: int, batch: int, repeat: bool, shuffle: bool
) -> None:
    """epoch, epoch_detail, previous_epoch_detail, is_new_epoch and the batches, step by step,
    including batches that wrap across an epoch's end and batches larger than the dataset."""
    import chainer

    from mnify.runtime.iterators.global_batch_iterator import (
        create_global_batch_iterator,
        epoch_order,
    )

    calls = iter(range(10**6))
    sampler = (lambda order, position: epoch_order(0, next(calls), n)) if shuffle else None
    ref = chainer.iterators.SerialIterator(
        list(range(n)),
        batch,
        repeat=repeat,
        shuffle=None if shuffle else False,
        order_sampler=sampler,
    )
    ours = create_global_batch_iterator(list(range(n)), batch, _OneRank(), repeat, shuffle)
    for _ in range(9):
        want = next(ref, None)
        got = next(ours, None)
        assert got == want
        for name in ("epoch", "epoch_detail", "previous_epoch_detail", "is_new_epoch"):
            assert getattr(ours, name) == getattr(ref, name), name
    assert ours.iteration == (9 if repeat else 3)


def test_state_round_trip_and_loaded_global_batch_wins(tmp_path: Path) -> None:
    import chainer

    from mnify.runtime.iterators.global_batch_iterator import create_global_batch_iterator

    data = list(range(11))
    it = create_global_batch_iterator(data, 4, _OneRank())
    for _ in range(4):
        it.next()
    it.batch_size = 5
    path = tmp_path / "it.npz"
    chainer.serializers.save_npz(str(path), it)
    fresh = create_global_batch_iterator(data, 3, _OneRank())
    chainer.serializers.load_npz(str(path), fresh)
    assert fresh.batch_size == 5
    assert [fresh.next() for _ in range(3)] == [it.next() for _ in range(3)]
    assert (fresh.epoch, fresh.iteration) == (it.epoch, it.iteration)


def test_splits() -> None:
    from mnify.runtime.iterators.batch_split import even_shares, proportional_shares

    assert even_shares(7, 3) == [3, 2, 2]
    assert even_shares(2, 3) == [1, 1, 0]
    assert proportional_shares(12, [1, 3, 2]) == [2, 6, 4]
    assert proportional_shares(10, [100, 1, 1]) == [8, 1, 1]  # at least one each
    for total in range(3, 40):
        shares = proportional_shares(total, [0.7, 2.9, 1.3])
        assert sum(shares) == total and min(shares) >= 1


def test_speed_split_reaches_proportional_shares_within_ten_steps() -> None:
    """Constant per-example times 1 : 3 : 1.5 (ranks 0..2), noisy by 10%: from the second
    step on, every share is within one example of the proportional one and stays there."""
    from mnify.runtime.iterators.batch_split import SpeedSplit

    rng = np.random.RandomState(0)
    per_example = [1.0, 3.0, 1.5]
    split = SpeedSplit(3)
    total = 60
    speeds = [1 / t for t in per_example]
    ideal = [total * s / sum(speeds) for s in speeds]
    history = []
    for _ in range(10):
        shares = split.split(total)
        history.append(shares)
        split.observe([t * (1 + 0.1 * rng.uniform(-1, 1)) for t in per_example])
    assert history[0] == [20, 20, 20]
    for shares in history[2:]:
        assert sum(shares) == total
        assert all(abs(n - x) <= 1 for n, x in zip(shares, ideal, strict=True)), (shares, ideal)
    assert len({tuple(s) for s in history[2:]}) <= 2  # smoothed: no oscillation


def test_collective_time_is_not_compute_time() -> None:
    """The clock counts only the time between a published collective's enter and leave."""
    from mnify.runtime.iterators.batch_split import CollectiveClock

    now = [0.0]
    clock = CollectiveClock(lambda: now[0])
    now[0] = 1.0
    clock.collective_enters(None, "allreduce", 1, 8, (), {})
    now[0] = 3.5
    clock.collective_leaves(None, "allreduce", 1, False, None)
    now[0] = 4.0
    assert clock.inside == 2.5


class _SecondOfTwo:
    """Rank 1 of 2 for the optimizer wrapper, exchanging nothing (the other rank is imagined)."""

    name, rank, size = "naive", 1, 2

    def bcast_data(self, model: Any) -> None:
        pass

    def multi_node_mean_grad(self, model: Any, zero_fill: bool = True) -> None:
        pass


@pytest.mark.parametrize("with_reporter", [False, True])
def test_an_empty_share_contributes_zero_gradient_and_reports_nothing(with_reporter: bool) -> None:
    """A step whose shares are (3, 0): rank 1 runs the loss on zero examples (Chainer's
    softmax_cross_entropy backward included), its gradient is zero, and what the model reports
    is dropped -- with a reporter or without one (a hand loop)."""
    import chainer
    import chainer.links as L

    from mnify.runtime.iterators import empty_share_fixes, global_step
    from mnify.runtime.optimizers import create_multi_node_optimizer

    empty_share_fixes.apply()  # as importing the global-batch iterator does
    model = L.Classifier(L.Linear(4, 3))
    opt = create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.1), _SecondOfTwo())
    opt.setup(model)
    before = {n: np.array(p.array) for n, p in model.namedparams()}
    global_step.record(global_step.GlobalStep(1, 3, (3, 0), 1, owner=-7))
    try:
        x, t = np.zeros((0, 4), np.float32), np.zeros(0, np.int32)
        observation: dict[str, Any] = {}
        if with_reporter:
            reporter = chainer.Reporter()
            reporter.add_observer("main", model)
            with reporter.scope(observation):
                opt.update(model, x, t)
        else:
            opt.update(model, x, t)
    finally:
        global_step.withdraw(-7)
    assert observation == {}
    assert opt.t == 1
    for name, param in model.namedparams():
        assert not np.any(param.grad), name
        assert np.array_equal(param.array, before[name]), name


def test_reader_threads_read_the_same_examples() -> None:
    """``n_threads``: this rank's examples of each step read by a thread pool, in order."""
    from mnify.runtime.iterators.global_batch_iterator import create_global_batch_iterator

    read: list[int] = []

    class Recording(list):  # type: ignore[type-arg]
        def __getitem__(self, i: Any) -> Any:
            read.append(i)
            return super().__getitem__(i)

    data = Recording(range(17))
    plain = create_global_batch_iterator(list(range(17)), 5, _OneRank())
    threaded = create_global_batch_iterator(data, 5, _OneRank(), n_threads=3)
    expected: list[int] = []
    for _ in range(8):
        assert threaded.next() == plain.next()  # in order, though read by several threads
        expected += [int(i) for i in plain.global_indices]
    assert sorted(read) == sorted(expected)  # each example of each step once, nothing ahead
    threaded.finalize()
    with pytest.raises(ValueError, match="n_threads"):
        create_global_batch_iterator(data, 5, _OneRank(), n_threads=0)
