"""Issue 12: how researchers' code is converted (asserted on the output's AST and the report)."""

from __future__ import annotations

import ast
import textwrap
from typing import Any

from mnify.converter import convert_source, convert_sources
from mnify.rewrites.options import ConvertOptions
from tests.convert.ast_checks import (
    assert_has_statement,
    assert_no_statement,
    index_of,
    is_statement,
)

HEAD = textwrap.dedent(
    """\
    import argparse

    import chainer
    import chainer.links as L
    from chainer import training
    from chainer.training import extensions
    """
)


def _main(text: str) -> list[ast.stmt]:
    """The statements of main()'s own block."""
    tree = ast.parse(text)
    main = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "main")
    return main.body


# main()'s own statements, not those of blocks nested in it
MAIN_BLOCK: dict[str, Any] = {"within": "main", "top_level": True}


def _entries(results, severity: str, step: str) -> list:
    return [e for r in results for e in r.entries if e.severity == severity and e.step == step]


def test_training_inside_a_helper_that_keeps_its_optimizer_is_distributed_at_run_time() -> None:
    """Issue 21: a Trainer built and run by a helper that keeps its optimizer cannot be converted
    statically; the entry point creates the communicator and calls mn.distribute_trainers(comm)
    right after it, and the report says what that covers. ChainerMN has no such function:
    under --target chainermn the project is left as it is, and said."""
    lib = textwrap.dedent(
        """\
        import chainer
        from chainer import training


        def make_optimizer(model):
            optimizer = chainer.optimizers.Adam()
            optimizer.setup(model)
            return optimizer


        def run_train(model, train):
            optimizer = make_optimizer(model)
            it = chainer.iterators.SerialIterator(train, 8)
            trainer = training.Trainer(training.StandardUpdater(it, optimizer), (1, 'epoch'))
            trainer.run()
        """
    )
    train = HEAD + textwrap.dedent(
        """\
        from lib import run_train


        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            train, test = chainer.datasets.get_mnist()
            print('training')
            run_train(L.Classifier(L.Linear(None, 10)), train)
        """
    )
    sources = {"p/train.py": train, "p/lib.py": lib}
    results = convert_sources(sources)
    assert all(r.error is None for r in results)
    assert not results[1].changed, "the helper has nothing rank 0 alone must do"
    assert results[0].output is not None
    text = results[0].output
    main = _main(text)
    creation = index_of(main, "comm = mn.create_communicator(...)")
    assert is_statement(main[creation + 1], "mn.distribute_trainers(comm)")
    assert_has_statement(text, "if comm.rank == 0:\n    print('training')", **MAIN_BLOCK)
    # on every rank
    assert_has_statement(text, "run_train(L.Classifier(L.Linear(None, 10)), train)", **MAIN_BLOCK)
    said = _entries(results, "changed", "trainers")
    assert [(e.path, e.code) for e in said] == [("p/train.py", "MN813")]
    assert "lib.py:" in said[0].message and "Trainer" in said[0].message
    assert [e.code for e in _entries(results, "needs-person", "trainers")] == ["MN813"]
    # what the runtime converts is no longer listed as needing a person
    assert not [
        e
        for r in results
        for e in r.entries
        if e.severity == "needs-person" and e.code in ("MN503", "MN504", "MN505")
    ]

    kept = convert_sources(sources, ConvertOptions(target="chainermn"))
    assert all(r.error is None and not r.changed for r in kept)
    notes = [e for r in kept for e in r.entries if e.severity == "needs-person"]
    assert [e.code for e in notes if e.message.startswith("nothing was parallelised")] == ["MN503"]
    assert any("distribute_trainers" in e.message for e in notes)


def test_training_in_a_library_outside_the_converted_files_is_distributed_at_run_time() -> None:
    """Only the script is converted; ``run_train`` comes from an installed package. The
    communicator and mn.distribute_trainers(comm) are added, and the report says that the
    package's first-use caches cannot be changed here."""
    train = HEAD + textwrap.dedent(
        """\
        from segkit.training import run_train


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument('--out', default='result')
            args = parser.parse_args()
            train, valid = chainer.datasets.get_mnist()
            model = L.Classifier(L.Linear(None, 10))
            run_train(model, train, valid, batchsize=32, epoch=1, out=args.out)
            chainer.serializers.save_npz('model.npz', model)
        """
    )
    result = convert_source(train, "train.py")
    assert result.error is None and result.output is not None
    main = _main(result.output)
    creation = index_of(main, "comm = mn.create_communicator(...)")
    assert is_statement(main[creation + 1], "mn.distribute_trainers(comm)")
    assert_has_statement(
        result.output,
        "if comm.rank == 0:\n    chainer.serializers.save_npz('model.npz', model)",
        **MAIN_BLOCK,
    )
    steps = sorted((e.severity, e.code) for e in result.entries if e.step == "trainers")
    assert steps == [("changed", "MN813"), ("needs-person", "MN813"), ("needs-person", "MN813")]
    assert any("cache" in e.message for e in result.entries if e.step == "trainers")


def test_a_script_that_only_evaluates_a_saved_model_gets_no_run_time_distribution() -> None:
    """A model built and handed to no training function: no communicator, no line added."""
    script = HEAD + textwrap.dedent(
        """\
        from segkit.metrics import score


        def main():
            model = L.Classifier(L.Linear(None, 10))
            chainer.serializers.load_npz('model.npz', model)
            print(score(model))
        """
    )
    result = convert_source(script, "evaluate.py")
    assert result.error is None and not result.changed
    assert [e.code for e in result.entries if e.step == "communicator"] == ["MN801"]


def test_a_helper_with_a_hand_written_loop_gets_no_run_time_distribution() -> None:
    """No Trainer in the converted files: distribute_trainers would not reach the loop, so it
    is not added (the loop is the static rewrites' to convert, or to report)."""
    lib = textwrap.dedent(
        """\
        import chainer


        def fit(model, train, epochs):
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            for _ in range(epochs):
                for x, t in chainer.iterators.SerialIterator(train, 8, repeat=False):
                    optimizer.update(model, x, t)
        """
    )
    train = HEAD + textwrap.dedent(
        """\
        from lib import fit


        def main():
            train, test = chainer.datasets.get_mnist()
            fit(L.Classifier(L.Linear(None, 10)), train, 1)
        """
    )
    results = convert_sources({"p/train.py": train, "p/lib.py": lib})
    assert all(r.error is None and r.output is not None for r in results)
    calls = [
        node.func
        for r in results
        for node in ast.walk(ast.parse(r.output or ""))
        if isinstance(node, ast.Call)
    ]
    assert not [
        f for f in calls if isinstance(f, ast.Attribute) and f.attr == "distribute_trainers"
    ]
    assert not [e for r in results for e in r.entries if e.step == "trainers"]


def test_a_training_helper_of_the_script_fetches_the_communicator_and_keeps_its_signature() -> None:
    """``train_one_fold(fold, train, valid, args)`` builds its optimizer and trains: nothing to
    wrap at its call. It keeps its signature and takes main()'s communicator from the runtime;
    with ``--target chainermn`` (no such function) the script is left alone and said."""
    source = HEAD + textwrap.dedent(
        """

        def train_one_fold(fold, train, valid, args):
            \"\"\"One fold.\"\"\"
            model = L.Classifier(L.Linear(None, 3))
            optimizer = chainer.optimizers.Adam()
            optimizer.setup(model)
            it = chainer.iterators.SerialIterator(train, args.batchsize)
            trainer = training.Trainer(training.StandardUpdater(it, optimizer), (1, 'epoch'))
            trainer.extend(extensions.LogReport())
            trainer.run()


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument('--batchsize', type=int, default=8)
            args = parser.parse_args()
            data = chainer.datasets.get_mnist()[0]
            for fold, (train, valid) in enumerate(
                    chainer.datasets.get_cross_validation_datasets(data, 3)):
                train_one_fold(fold, train, valid, args)
        """
    )
    result = convert_source(source, "train.py")
    assert result.error is None and result.output is not None
    tree = ast.parse(result.output)
    helper = next(
        s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "train_one_fold"
    )
    assert [a.arg for a in helper.args.args] == ["fold", "train", "valid", "args"]
    assert is_statement(helper.body[1], "comm = mn.current_communicator()")  # after the docstring
    fold = {"within": "train_one_fold", "top_level": True}
    assert_has_statement(
        result.output,
        "optimizer = mn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)",
        **fold,
    )
    assert_has_statement(
        result.output, "train = mn.scatter_dataset(train, comm, shuffle=True)", **fold
    )
    assert_has_statement(
        result.output, "if comm.rank == 0:\n    trainer.extend(extensions.LogReport())", **fold
    )
    assert_has_statement(result.output, "comm = mn.create_communicator(...)", **MAIN_BLOCK)

    kept = convert_source(source, "train.py", ConvertOptions(target="chainermn"))
    assert kept.error is None and not kept.changed
    assert any(
        e.message.startswith("nothing was parallelised")
        for e in kept.entries
        if e.severity == "needs-person"
    )


def test_models_and_optimizers_built_by_name_are_converted_where_bound() -> None:
    models = textwrap.dedent(
        """\
        import chainer
        import chainer.links as L


        class Net(chainer.Chain):
            def __init__(self, n):
                super().__init__()
                with self.init_scope():
                    self.l = L.Linear(None, n)
                    self.bn = L.BatchNormalization(n)

            def forward(self, x):
                return self.bn(self.l(x))
        """
    )
    train = HEAD + textwrap.dedent(
        """\
        import models


        def build(conf, namespace):
            return getattr(namespace, conf['name'])(**conf.get('args', {}))


        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            config = {'model': {'name': 'Net', 'args': {'n': 3}}, 'optimizer': {'name': 'SGD'}}
            predictor = build(config['model'], models)
            model = L.Classifier(predictor)
            optimizer = build(config['optimizer'], chainer.optimizers)
            optimizer.setup(model)
            train, _ = chainer.datasets.get_mnist()
            it = chainer.iterators.SerialIterator(train, 8)
            trainer = training.Trainer(training.StandardUpdater(it, optimizer), (1, 'epoch'))
            trainer.run()
        """
    )
    results = convert_sources({"p/train.py": train, "p/models.py": models})
    assert [r.error for r in results] == [None, None]
    by_path = {r.path: r for r in results}
    assert not by_path["p/models.py"].changed  # the class keeps its signature and its BN
    text = by_path["p/train.py"].output or ""
    assert_has_statement(
        text, "predictor = mn.links.create_mnbn_model(predictor, comm)", **MAIN_BLOCK
    )
    assert_has_statement(
        text,
        "optimizer = mn.create_multi_node_optimizer("
        "build(config['optimizer'], chainer.optimizers), comm)",
        **MAIN_BLOCK,
    )


def test_a_user_iterator_gets_a_contiguous_shard() -> None:
    source = HEAD + textwrap.dedent(
        """\
        from iterators import WindowIterator


        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            corpus = chainer.datasets.get_ptb_words()[0]
            model = L.Classifier(L.Linear(None, 10))
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            train_iter = WindowIterator(corpus, 5, 32)
            trainer = training.Trainer(training.StandardUpdater(train_iter, optimizer), (1, 'epoch'))
            trainer.run()
        """
    )
    result = convert_source(source)
    assert result.error is None
    # no shuffle: contiguous
    assert_has_statement(
        result.output or "", "corpus = mn.scatter_dataset(corpus, comm)", **MAIN_BLOCK
    )


def test_loading_in_an_if_elif_chain_runs_on_rank_0_but_the_rest_everywhere() -> None:
    source = HEAD + textwrap.dedent(
        """\
        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument('--dataset', default='cifar10')
            args = parser.parse_args()
            if args.dataset == 'cifar10':
                class_labels = 10
                train, test = chainer.datasets.get_cifar10()
            else:
                class_labels = 100
                train, test = chainer.datasets.get_cifar100()
            model = L.Classifier(L.Linear(None, class_labels))
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            it = chainer.iterators.SerialIterator(train, 8)
            test_it = chainer.iterators.SerialIterator(test, 8, repeat=False)
            trainer = training.Trainer(training.StandardUpdater(it, optimizer), (1, 'epoch'))
            trainer.run()
        """
    )
    result = convert_source(source)
    assert result.error is None
    tree = ast.parse(result.output or "")
    main = next(s for s in tree.body if isinstance(s, ast.FunctionDef))
    chain = next(s for s in main.body if isinstance(s, ast.If) and "dataset" in ast.unparse(s.test))
    for branch in (chain.body, chain.orelse):
        assert is_statement(branch[0], "class_labels = ...")  # still on every rank
        assert is_statement(
            branch[1],
            """\
            if comm.rank == 0:
                ...
            else:
                train, test = None, None
                ...
            """,
        )


def test_a_post_training_tail_reading_the_test_set_runs_on_rank_0_with_all_of_it() -> None:
    source = HEAD + textwrap.dedent(
        """\
        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            train, test = chainer.datasets.get_mnist()
            model = L.Classifier(L.Linear(None, 10))
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            it = chainer.iterators.SerialIterator(train, 8)
            test_it = chainer.iterators.SerialIterator(test, 8, repeat=False)
            trainer = training.Trainer(training.StandardUpdater(it, optimizer), (1, 'epoch'))
            trainer.run()
            x, t = test[0]
            print('first test label', t, 'of', len(test))
        """
    )
    result = convert_source(source)
    assert result.error is None
    text = result.output or ""
    assert_has_statement(
        text,
        "test_it = chainer.iterators.SerialIterator(mn.scatter_dataset(test, comm), 8, repeat=False)",
        **MAIN_BLOCK,
    )
    assert_no_statement(text, "test = mn.scatter_dataset(...)", **MAIN_BLOCK)
    assert is_statement(_main(text)[-1], "if comm.rank == 0:\n    x, t = test[0]\n    ...")


def test_a_test_set_loaded_after_the_training_iterator_is_scattered_after_its_loading() -> None:
    source = HEAD + textwrap.dedent(
        """\
        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            model = L.Classifier(L.Linear(None, 10))
            train = chainer.datasets.TransformDataset(chainer.datasets.get_mnist()[0], lambda x: x)
            train_iter = chainer.iterators.SerialIterator(train, 8)
            test = chainer.datasets.get_mnist()[1]
            test_iter = chainer.iterators.SerialIterator(test, 8, repeat=False)
            optimizer = chainer.optimizers.SGD()
            optimizer.setup(model)
            trainer = training.Trainer(training.StandardUpdater(train_iter, optimizer), (1, 'epoch'))
            trainer.run()
        """
    )
    result = convert_source(source)
    assert result.error is None, result.error
    main = _main(result.output or "")
    # a TransformDataset is built on every rank and sliced by index: nothing pickled
    sliced = "train = chainer.datasets.SubDataset(train, *mn.scatter_index(len(train), comm))"
    assert index_of(main, sliced) < index_of(
        main, "train_iter = chainer.iterators.SerialIterator(train, 8)"
    )
    loading = index_of(
        main, "if comm.rank == 0:\n    test = chainer.datasets.get_mnist()[1]\nelse:\n    ..."
    )
    assert is_statement(main[loading + 1], "test = mn.scatter_dataset(test, comm)")
