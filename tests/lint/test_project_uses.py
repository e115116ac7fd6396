"""Hazards judge the program, not only their file (mnify/program/project.py): a finding another
part of the program answers is not reported, and the same finding is reported without it."""

from __future__ import annotations

import textwrap

from mnify.lint.runner import lint_source
from mnify.program.project import ProjectUses

TRAINER_SCRIPT = textwrap.dedent(
    """\
    import chainer
    import chainermn
    from chainer import training
    from chainer.training import extensions
    {runtime_import}

    comm = chainermn.create_communicator()
    model = chainer.links.Classifier(chainer.links.Linear(3, 2))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    train, test = chainer.datasets.get_mnist()
    train_iter = chainer.iterators.SerialIterator(train, 32)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (1, "epoch"))
    trainer.extend(extensions.Evaluator(chainer.iterators.SerialIterator(test, 32), model))
    trainer.extend(extensions.LogReport())
    {distribute}
    trainer.run()
    """
)


def _codes(source: str, path: str = "train.py", **kwargs: object) -> list[str]:
    return sorted(d.code for d in lint_source(source, path, **kwargs))  # type: ignore[arg-type]


def test_trainers_distributed_at_run_time_answer_the_pieces_the_runtime_converts() -> None:
    plain = TRAINER_SCRIPT.format(runtime_import="", distribute="")
    assert {"MN401", "MN503", "MN504", "MN505"} <= set(_codes(plain))
    distributed = TRAINER_SCRIPT.format(
        runtime_import="import mnify.runtime as mn", distribute="mn.distribute_trainers(comm)"
    )
    left = _codes(distributed)
    assert not {"MN401", "MN503", "MN504", "MN505"} & set(left), left


def test_a_writer_the_runtime_does_not_guard_is_still_reported() -> None:
    script = TRAINER_SCRIPT.format(
        runtime_import="import mnify.runtime as mn", distribute="mn.distribute_trainers(comm)"
    ).replace("extensions.LogReport()", "extensions.snapshot_object(model, 'm')")
    plain = script.replace("extensions.snapshot_object(model, 'm')", "extensions.Snapshot()")
    assert "MN401" not in _codes(script)
    assert "MN401" in _codes(plain)  # ``Snapshot`` is not among the run-time guarded writers


NET = textwrap.dedent(
    """\
    import chainer
    import chainer.links as L


    class Net(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.bn = L.BatchNormalization(8)


    def make_optimizer(model):
        optimizer = chainer.optimizers.Adam()
        optimizer.setup(model)
        return optimizer


    class Checkpoint:
        def save(self, model):
            chainer.serializers.save_npz("model.npz", model)
    """
)

TRAIN = textwrap.dedent(
    """\
    import chainer
    import chainermn
    from net import Net, make_optimizer, Checkpoint

    comm = chainermn.create_communicator()
    model = chainermn.links.create_mnbn_model(Net(), comm)
    optimizer = chainermn.create_multi_node_optimizer(make_optimizer(model), comm)
    checkpoint = Checkpoint()
    if comm.rank == 0:
        checkpoint.save(model)
    """
)


def test_another_file_answers_the_helpers_and_the_model_class() -> None:
    alone = _codes(NET, "net.py", assume="data")
    assert {"MN402", "MN502", "MN503"} <= set(alone), alone
    uses = ProjectUses.of_sources([NET, TRAIN])
    together = _codes(NET, "net.py", assume="data", project=uses)
    assert not {"MN402", "MN502", "MN503"} & set(together), together


def test_a_method_also_called_on_every_rank_still_writes_on_every_rank() -> None:
    everywhere = TRAIN + "checkpoint.save(model)\n"
    uses = ProjectUses.of_sources([NET, everywhere])
    assert uses.rank0_only_functions == frozenset()
    assert "MN402" in _codes(NET, "net.py", assume="data", project=uses)


CACHE_HELPER = textwrap.dedent(
    """\
    import os

    import chainermn
    import numpy as np

    comm = chainermn.create_communicator()


    def load_features(cache):
        if not os.path.exists(cache):
            np.save(cache, np.zeros((10, 3), np.float32))
        return np.load(cache)


    x = comm.bcast_obj(load_features('feats.npy') if comm.rank == 0 else None)
    """
)


def test_a_cache_helper_run_on_rank_0_and_broadcast_writes_on_rank_0_only() -> None:
    """The converter's ``comm.bcast_obj(load(...) if comm.rank == 0 else None)``: the helper's
    write is rank 0's, so lint of a converted script does not report what the conversion did."""
    uses = ProjectUses.of_sources([CACHE_HELPER])
    assert uses.rank0_only_functions == frozenset({"load_features"})
    assert "MN402" not in _codes(CACHE_HELPER, "train.py", project=uses)
    everywhere = CACHE_HELPER + "y = load_features('other.npy')\n"
    again = ProjectUses.of_sources([everywhere])
    assert "MN402" in _codes(everywhere, "train.py", project=again)


def test_extensions_of_a_helper_distributed_after_it_returns() -> None:
    helper = textwrap.dedent(
        """\
        import chainer
        import chainermn
        from chainer.training import extensions

        comm = chainermn.create_communicator()


        def build_trainer(trainer, test_iter, model):
            trainer.extend(extensions.Evaluator(test_iter, model))
            trainer.extend(extensions.LogReport())
            return trainer
        """
    )
    caller = (
        "import mnify.runtime as mn\n"
        "trainer = build_trainer(trainer, test_iter, model)\n"
        "mn.distribute_extensions(trainer, comm)\n"
    )
    assert {"MN401", "MN505"} <= set(_codes(helper))
    uses = ProjectUses.of_sources([helper, caller])
    assert uses.extension_helpers_distributed == frozenset({"build_trainer"})
    assert not {"MN401", "MN505"} & set(_codes(helper, project=uses))


def test_files_that_do_not_parse_add_nothing() -> None:
    uses = ProjectUses.of_sources(["def broken(:\n", "x = create_mnbn_model(Net(), comm)\n"])
    assert uses.batch_normalization_converted
    assert not uses.trainers_distributed_at_run_time
    assert ProjectUses.of_sources(["def broken(:\n"]) == ProjectUses()
