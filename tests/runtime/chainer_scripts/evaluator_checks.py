"""Rank script: the multi-node evaluator reports means over all examples, even with uneven shards.

The reference is one process evaluating the whole test set in a single batch (so its mean is
the exact per-example mean). Shards are scattered with ``force_equal_length=False`` so ranks hold
different numbers of examples; ChainerMN's unweighted mean of rank means would be off.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import chainer
import chainer.links as L
import numpy as np
from chainer.training import extensions

from mnify.runtime.datasets.scatter_dataset import scatter_dataset
from mnify.runtime.extensions.generic_evaluator import GenericMultiNodeEvaluator
from mnify.runtime.extensions.multi_node_evaluator import create_multi_node_evaluator
from tests.support.rank_checks import assert_close, make_comm, passed

chainer.global_config.dtype = np.dtype(np.float64)
comm = make_comm()
rank, size = comm.rank, comm.size
# how long the slow ranks of the watchdog check sleep: longer than MNIFY_WATCHDOG_TIMEOUT
WAIT = float(os.environ.get("MNIFY_TEST_SLOW_RANK_SECONDS", "0"))


def make_model() -> chainer.Link:
    np.random.seed(0)  # the same model on every rank
    return L.Classifier(L.Linear(4, 3))


def make_data(n: int) -> chainer.datasets.TupleDataset:
    rng = np.random.RandomState(n)
    return chainer.datasets.TupleDataset(rng.randn(n, 4), rng.randint(0, 3, n).astype(np.int32))


def reference(model: chainer.Link, data: Any) -> dict[str, float]:
    it = chainer.iterators.SerialIterator(data, len(data), repeat=False, shuffle=False)
    return {k: float(v) for k, v in extensions.Evaluator(it, model)().items()}


def evaluate_on_ranks(model: chainer.Link, n: int, batch: int, evaluator_class: Any) -> Any:
    shard = scatter_dataset(make_data(n) if rank == 0 else None, comm, force_equal_length=False)
    it = chainer.iterators.SerialIterator(shard, batch, repeat=False, shuffle=False)
    evaluator = create_multi_node_evaluator(evaluator_class(it, model), comm)
    return evaluator(), shard, evaluator


def check(n: int, batch: int, evaluator_class: Any = extensions.Evaluator) -> None:
    model = make_model()
    expected = reference(model, make_data(n))
    got, shard, evaluator = evaluate_on_ranks(model, n, batch, evaluator_class)
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for key in expected:
        assert_close(f"n={n} batch={batch} {key}", got[key], expected[key], rtol=1e-10)
    # evaluating again gives the same (the iterator is restored and reset)
    again = evaluator()
    for key in expected:
        assert_close(f"second evaluation {key}", again[key], got[key], rtol=1e-12)
    # the test is sensitive: ChainerMN's unweighted mean of rank means misses here
    local = reference(model, shard) if len(shard) else {}
    everyone = comm.allgather_obj((len(shard), local))
    if len({length for length, _ in everyone}) > 1 and all(length > 0 for length, _ in everyone):
        unweighted = np.mean([means["main/loss"] for _, means in everyone])
        assert abs(unweighted - expected["main/loss"]) > 1e-9, "shards too alike to tell"


class ManualEvaluator(extensions.Evaluator):  # type: ignore[misc]
    """Overrides evaluate without eval_func: weighted by the examples drawn from the iterator."""

    def evaluate(self) -> dict[str, Any]:
        it = self.get_iterator("main")
        it.reset()
        model = self.get_target("main")
        total, count = 0.0, 0
        for batch in it:
            x, t = chainer.dataset.concat_examples(batch)
            with chainer.no_backprop_mode():
                total += float(model(x, t).array) * len(batch)
            count += len(batch)
        return {"main/loss": total / count} if count else {}


def one_step_trainer(out: str) -> tuple[chainer.Link, Any, Any]:
    """A model, a one-iteration trainer on a shard of 8 examples (lr 0: the model stays as it
    is), and an iterator over this rank's uneven shard of 11 test examples."""
    model = make_model()
    train = scatter_dataset(make_data(8) if rank == 0 else None, comm)
    test = scatter_dataset(make_data(11) if rank == 0 else None, comm, force_equal_length=False)
    optimizer = chainer.optimizers.SGD(lr=0.0)
    optimizer.setup(model)
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator(train, 2), optimizer
    )
    trainer = chainer.training.Trainer(updater, (1, "iteration"), out=out)
    return model, trainer, chainer.iterators.SerialIterator(test, 4, repeat=False, shuffle=False)


def check_in_trainer() -> None:
    """As the converter emits it: extended to a trainer on every rank, reported under its name."""
    model, trainer, test_it = one_step_trainer("/tmp/mnify-eval-test")
    trainer.extend(
        create_multi_node_evaluator(extensions.Evaluator(test_it, model), comm),
        trigger=(1, "iteration"),
    )
    seen: dict[str, float] = {}

    @chainer.training.make_extension(trigger=(1, "iteration"), priority=-100)
    def capture(trainer: Any) -> None:
        seen.update(
            {k: float(v) for k, v in trainer.observation.items() if k.startswith("validation/")}
        )

    trainer.extend(capture)
    trainer.run()
    expected = reference(model, make_data(11))
    assert_close("trainer loss", seen["validation/main/loss"], expected["main/loss"], 1e-10)
    assert_close("accuracy", seen["validation/main/accuracy"], expected["main/accuracy"], 1e-10)


def add_extensions(trainer: Any, model: chainer.Link, test_it: Any) -> None:
    """A script's helper that registers its extensions without a communicator."""
    trainer.extend(extensions.Evaluator(test_it, model), trigger=(1, "iteration"))
    trainer.extend(extensions.LogReport(trigger=(1, "iteration")))
    trainer.extend(extensions.PrintReport(["iteration", "validation/main/loss"]))
    trainer.extend(extensions.snapshot(), trigger=(1, "iteration"))


def check_distributed_extensions() -> None:
    """distribute_extensions after such a helper: the evaluator covers the whole test set, and
    only rank 0 keeps what writes (LogReport stays everywhere, without a file)."""
    import tempfile

    from mnify.runtime.extensions.distribute import distribute_extensions

    out = tempfile.mkdtemp(prefix=f"mnify-distribute-{rank}-")
    model, trainer, test_it = one_step_trainer(out)
    add_extensions(trainer, model, test_it)
    distribute_extensions(trainer, comm)
    distribute_extensions(trainer, comm)  # idempotent
    trainer.run()
    log = trainer.get_extension("LogReport").log
    expected = reference(model, make_data(11))
    assert_close("validation loss", log[-1]["validation/main/loss"], expected["main/loss"], 1e-10)
    names = sorted(trainer._extensions)
    written = sorted(os.listdir(out))
    if rank == 0:
        assert names == ["LogReport", "PrintReport", "_Snapshot", "validation"], names
        assert "log" in written and any(w.startswith("snapshot") for w in written), written
    else:
        assert names == ["LogReport", "validation"], names
        assert written == [], written


def mean_checks() -> None:
    """create_multi_node_evaluator averaging (ChainerMN's behaviour, weighted by examples)."""
    check(11, 64)  # uneven shards, one batch each
    check(11, 2)  # uneven shards and short last batches
    passed("weighted by examples: uneven shards and short batches match one process", comm)

    check(2, 4)  # fewer examples than ranks: some ranks evaluate nothing
    passed("ranks with empty shards", comm)

    model = make_model()
    expected_loss = reference(model, make_data(13))["main/loss"]
    got, _, _ = evaluate_on_ranks(model, 13, 3, ManualEvaluator)
    assert_close("custom evaluate", got["main/loss"], expected_loss, rtol=1e-10)
    passed("custom evaluate weighted by iterator counts", comm)

    check_in_trainer()
    passed("inside a trainer, reported as validation/main/*", comm)

    check_distributed_extensions()
    passed("distribute_extensions: a helper's evaluator and writers made data-parallel", comm)


# ------------------------------------------------------------------------------------------
# Issue 12, pattern 5: iterators without reset(), metrics that are not means (gather=True),
# GenericMultiNodeEvaluator. References are one process over the whole test set, compared
# exactly: the model is per-example (elementwise products summed along each row), so its
# outputs do not depend on how examples are batched, and the metric is order-sensitive only
# through ties (none with random scores).

FEATURES = 8192  # float64: 64 KiB per example, so inputs fed to predict are withheld


class ShardIterator(chainer.dataset.Iterator):  # type: ignore[misc]
    """A user's evaluation iterator: no reset(), one pass, batches of (x, t) tuples."""

    def __init__(self, dataset: Any, batch_size: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.position = 0

    def __next__(self) -> Any:
        if self.position >= len(self.dataset):
            raise StopIteration
        batch = [
            self.dataset[i]
            for i in range(self.position, min(len(self.dataset), self.position + self.batch_size))
        ]
        self.position += len(batch)
        return batch


class Scorer(chainer.Chain):
    """A detector stand-in: predict(list of inputs) -> one score per input; counts real calls."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.w = chainer.Parameter(np.random.RandomState(7).randn(FEATURES))
        self.real_calls = 0

    def forward(self, x: Any) -> Any:
        return chainer.functions.sum(x * chainer.functions.broadcast_to(self.w, x.shape), axis=1)

    def predict(self, xs: list[np.ndarray]) -> list[float]:
        self.real_calls += 1
        with chainer.no_backprop_mode():
            scores = self.forward(np.stack(xs)).array
        return [float(s) for s in scores]


class OldStyleScorer(chainer.Chain):
    """Chainer-v1-style model: __call__ instead of forward; reports a loss per batch."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.w = chainer.Parameter(np.random.RandomState(7).randn(FEATURES))
        self.real_calls = 0

    def __call__(self, x: Any, t: Any) -> Any:
        self.real_calls += 1
        w = chainer.functions.broadcast_to(self.w, x.shape)
        losses = (chainer.functions.sum(x * w, axis=1) - t) ** 2
        chainer.report({"loss": chainer.functions.mean(losses)}, self)
        return losses


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean precision at each relevant example, ranked by score: not a mean over batches."""
    if not labels.any():
        raise ValueError("no relevant example")
    order = np.argsort(-scores, kind="stable")
    hits = labels[order].astype(np.float64)
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float((precision * hits).sum() / hits.sum())


class APEvaluator(extensions.Evaluator):  # type: ignore[misc]
    """In the style of chainercv's DetectionVOCEvaluator: predictions over the whole set."""

    touch_inputs = False

    def evaluate(self) -> dict[str, Any]:
        iterator = self._iterators["main"]
        target = self._targets["main"]
        if hasattr(iterator, "reset"):
            iterator.reset()
            it = iterator
        else:
            it = copy.copy(iterator)
        scores: list[float] = []
        labels: list[int] = []
        norms = 0.0
        for batch in it:
            xs = [x for x, _ in batch]
            labels.extend(int(t) for _, t in batch)
            scores.extend(target.predict(xs))
            if self.touch_inputs:  # uses the inputs beyond predict: they must be sent
                norms += float(sum(np.linalg.norm(x) for x in xs))
        observation: dict[str, Any] = {}
        with chainer.reporter.report_scope(observation):
            chainer.reporter.report(
                {"ap": average_precision(np.array(scores), np.array(labels))}, target
            )
        return observation


class MedianLossEvaluator(extensions.Evaluator):  # type: ignore[misc]
    """Converter + target call per batch, reports summarised; adds the median of all losses."""

    def evaluate(self) -> dict[str, Any]:
        it = self.get_iterator("main")
        it.reset()
        target = self.get_target("main")
        summary = chainer.reporter.DictSummary()
        losses: list[np.ndarray] = []
        for batch in it:
            observation: dict[str, Any] = {}
            with chainer.reporter.report_scope(observation):
                x, t = self.converter(batch, self.device)
                with chainer.no_backprop_mode():
                    losses.append(chainer.backends.cuda.to_cpu(target(x, t).array))
            summary.add(observation)
        result = summary.compute_mean()
        result["validation/main/median_loss"] = float(np.median(np.concatenate(losses)))
        return result


def ap_data(n: int, seed: int = 3) -> chainer.datasets.TupleDataset:
    rng = np.random.RandomState(seed)
    labels = (rng.rand(n) < 0.4).astype(np.int32)
    labels[0] = 1
    return chainer.datasets.TupleDataset(rng.randn(n, FEATURES), labels)


def shard_of(data: Any) -> Any:
    """An exact split (no repeated examples), in dataset order."""
    return scatter_dataset(data if rank == 0 else None, comm, force_equal_length=False)


def one_process(evaluator: Any) -> dict[str, float]:
    reporter = chainer.Reporter()
    evaluator.name = "validation"
    reporter.add_observer("validation/main", evaluator.get_target("main"))
    with reporter:
        return {k: float(v) for k, v in evaluator().items()}


def on_every_rank_equal(value: Any, what: str) -> None:
    everyone = comm.allgather_obj(value)
    assert all(v == everyone[0] for v in everyone), f"{what} differs across ranks: {everyone}"


def check_no_reset_mean() -> None:
    """The averaging evaluator copies an iterator without reset() (twice: same answer)."""
    model = make_model()
    data = make_data(11)
    expected = reference(model, data)
    evaluator = create_multi_node_evaluator(
        extensions.Evaluator(ShardIterator(shard_of(data), 3), model), comm
    )
    for _ in range(2):
        got = {k: float(v) for k, v in evaluator().items()}
        for key in expected:
            assert_close(f"no-reset {key}", got[key], expected[key], rtol=1e-10)


def check_gathered_ap(n: int, batch: int, touch: bool = False, no_reset: bool = False) -> None:
    data = ap_data(n)
    expected_model = Scorer()
    single = APEvaluator(
        chainer.iterators.SerialIterator(data, 4, repeat=False, shuffle=False), expected_model
    )
    expected = one_process(single)["validation/main/ap"]
    model = Scorer()
    shard = shard_of(data)
    it = (
        ShardIterator(shard, batch)
        if no_reset
        else chainer.iterators.SerialIterator(shard, batch, repeat=False, shuffle=False)
    )
    evaluator = APEvaluator(it, model)
    evaluator.touch_inputs = touch
    evaluator = create_multi_node_evaluator(evaluator, comm, gather=True)
    for attempt in range(2):
        got = one_process(evaluator)["validation/main/ap"]
        assert got == expected, (n, batch, touch, attempt, got, expected)
    on_every_rank_equal(got, "gathered ap")
    # rank 0 ran predict only on its own batches: the others' answers were replayed
    own_batches = -(-len(shard) // batch) if len(shard) else 0
    assert model.real_calls == 2 * own_batches, (model.real_calls, own_batches)
    assert "predict" not in vars(model) and type(model) is Scorer, "interception not undone"
    # the test can fail: per-shard AP averaged (ChainerMN's wrapper) is not the whole-set AP
    if n >= 3 * size:
        averaged = APEvaluator(
            chainer.iterators.SerialIterator(shard, batch, repeat=False, shuffle=False), Scorer()
        )
        mean_of_shards = one_process(create_multi_node_evaluator(averaged, comm))
        assert mean_of_shards["validation/main/ap"] != expected, "shards too alike to tell"


def check_gathered_old_style() -> None:
    n = 12
    data = ap_data(n, seed=5)
    data = chainer.datasets.TupleDataset(data._datasets[0], data._datasets[1].astype(np.float64))
    single = MedianLossEvaluator(
        chainer.iterators.SerialIterator(data, 12 // size, repeat=False, shuffle=False),
        OldStyleScorer(),
    )
    expected = one_process(single)
    model = OldStyleScorer()
    it = chainer.iterators.SerialIterator(
        shard_of(data), 12 // size // 2 or 1, repeat=False, shuffle=False
    )
    evaluator = create_multi_node_evaluator(MedianLossEvaluator(it, model), comm, gather=True)
    got = one_process(evaluator)
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    assert got["validation/main/median_loss"] == expected["validation/main/median_loss"]
    # the loss each call reported was replayed on rank 0 (equal batches: same mean)
    assert_close("loss", got["validation/main/loss"], expected["validation/main/loss"], 1e-12)
    on_every_rank_equal(got, "old-style result")
    own = len(it.dataset)
    assert model.real_calls == -(-own // it.batch_size), (model.real_calls, own)
    assert type(model) is OldStyleScorer and "_mn_intercepted_call" not in vars(model)


def check_gathered_errors() -> None:
    """An evaluate() that fails on one rank mid-shard fails on every rank; nobody hangs."""

    class Failing(APEvaluator):
        def evaluate(self) -> dict[str, Any]:
            if rank == size - 1:
                next(iter(self.get_iterator("main")))
                raise ZeroDivisionError("rank-local failure")
            return super().evaluate()

    shard = shard_of(ap_data(12))
    evaluator = create_multi_node_evaluator(
        Failing(chainer.iterators.SerialIterator(shard, 2, repeat=False, shuffle=False), Scorer()),
        comm,
        gather=True,
    )
    try:
        one_process(evaluator)
    except ZeroDivisionError:
        assert rank == size - 1
    except RuntimeError as exc:
        assert rank != size - 1 and f"rank {size - 1}" in str(exc), exc
    else:
        raise AssertionError("the failure was not raised")


def check_gathered_in_trainer_with_watchdog_waits() -> None:
    """In a trainer: every rank logs the same whole-set AP; ranks that wait long (uneven
    shards, rank 0 computing alone) wait in untimed barriers, not in timed collectives."""
    data = ap_data(10)
    expected = one_process(
        APEvaluator(
            chainer.iterators.SerialIterator(data, 4, repeat=False, shuffle=False), Scorer()
        )
    )["validation/main/ap"]

    class Slow(APEvaluator):
        calls = 0

        def evaluate(self) -> dict[str, Any]:
            Slow.calls += 1
            if (rank == 1 and Slow.calls == 1) or (rank == 0 and Slow.calls == 2):
                time.sleep(WAIT)  # rank 1's shard is slow; then rank 0's pass is slow
            return super().evaluate()

    model = Scorer()
    train = scatter_dataset(make_data(4) if rank == 0 else None, comm)
    optimizer = chainer.optimizers.SGD(lr=0.0)
    optimizer.setup(make_model())
    updater = chainer.training.StandardUpdater(
        chainer.iterators.SerialIterator(train, 2), optimizer
    )
    trainer = chainer.training.Trainer(updater, (1, "iteration"), out="/tmp/mnify-eval-test")
    it = chainer.iterators.SerialIterator(shard_of(data), 2, repeat=False, shuffle=False)
    trainer.extend(
        create_multi_node_evaluator(Slow(it, model), comm, gather=True), trigger=(1, "iteration")
    )
    seen: dict[str, float] = {}

    @chainer.training.make_extension(trigger=(1, "iteration"), priority=-100)
    def capture(trainer: Any) -> None:
        seen.update(
            {k: float(v) for k, v in trainer.observation.items() if k.startswith("validation/")}
        )

    trainer.extend(capture)
    trainer.run()
    assert seen["validation/main/ap"] == expected, (seen, expected)
    on_every_rank_equal(seen, "trainer observation")


class GenericAP(GenericMultiNodeEvaluator):
    """A ChainerMN-7-style user subclass: per-batch scores locally, AP over all of them."""

    def calc_local(self, x: Any, t: Any) -> Any:
        return self.get_target("main")(x).array, t

    def aggregate(self, results: list[Any]) -> dict[str, float]:
        scores = np.concatenate([s for s, _ in results])
        labels = np.concatenate([t for _, t in results])
        self.seen_labels = labels
        chainer.report({"n": float(len(labels))}, self.get_target("main"))
        return {"ap": average_precision(scores, labels)}


def check_generic(n: int, batch: int, no_reset: bool) -> None:
    data = ap_data(n)
    model = Scorer()
    single = GenericAP(
        None, chainer.iterators.SerialIterator(data, 5, repeat=False, shuffle=False), model
    )
    single.name = "validation"
    reporter = chainer.Reporter()
    observed: dict[str, Any] = {}
    with reporter.scope(observed):
        single_total = single()
    shard = shard_of(data)
    it = (
        ShardIterator(shard, batch)
        if no_reset
        else chainer.iterators.SerialIterator(shard, batch, repeat=False, shuffle=False)
    )
    evaluator = GenericAP(comm, it, model)
    evaluator.name = "validation"
    for _ in range(2):  # a second evaluation sees the whole shard again
        reporter = chainer.Reporter()
        mine: dict[str, Any] = {}
        with reporter.scope(mine):
            total = evaluator()
        assert {k: float(v) for k, v in mine.items()} == {
            "validation/ap": single_total["ap"],
            "validation/main/n": float(n),
        }, (mine, single_total)
        on_every_rank_equal({k: float(v) for k, v in mine.items()}, "generic observation")
        if rank == 0:
            assert total == single_total
            np.testing.assert_array_equal(evaluator.seen_labels, data._datasets[1])  # order
        else:
            assert total is None
    assert {k: float(v) for k, v in observed.items()}["validation/ap"] == single_total["ap"]


def pattern_checks() -> None:
    check_no_reset_mean()
    passed("averaging evaluator: iterator without reset() is copied, as Chainer does", comm)

    check_gathered_ap(23, 3)
    check_gathered_ap(23, 50)  # one batch per rank
    passed("gather: evaluate() override, whole-set AP equals one process exactly", comm)

    check_gathered_ap(23, 4, touch=True)
    passed("gather: inputs used beyond predict are sent on a second try, still exact", comm)

    check_gathered_ap(17, 3, no_reset=True)
    passed("gather: iterator without reset()", comm)

    check_gathered_ap(2, 2)  # fewer examples than ranks: empty shards
    passed("gather: ranks with empty shards", comm)

    check_gathered_old_style()
    passed("gather: old-style __call__ model, converter, reports replayed", comm)

    check_gathered_errors()
    passed("gather: a failure on one rank is raised on every rank", comm)

    check_gathered_in_trainer_with_watchdog_waits()
    passed("gather: in a trainer, same value on every rank, long waits untimed", comm)

    check_generic(23, 3, no_reset=False)
    check_generic(11, 4, no_reset=True)
    check_generic(2, 2, no_reset=False)
    passed("GenericMultiNodeEvaluator: aggregate over all ranks equals one process", comm)


GROUPS = {"mean": mean_checks, "patterns": pattern_checks}
GROUPS[os.environ.get("MNIFY_EVALUATOR_CHECKS", "mean")]()
