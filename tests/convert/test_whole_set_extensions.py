"""Issue 22, part 2: an extension of the project that reads a held-out dataset itself keeps the
whole set on rank 0 while the evaluator gets the scattered shard
(mnify/rewrites/whole_set_extensions.py; asserted on the output's AST; the corpus script
trainer_topk_extension_dictconfig runs it on 2 ranks)."""

from __future__ import annotations

import ast
import textwrap

from mnify.converter import convert_source

SCRIPT = textwrap.dedent(
    """\
    import argparse

    import chainer
    import chainer.links as L
    from chainer import training
    from chainer.training import extensions


    class Coverage(training.Extension):
        def __init__(self, model, data):
            self.model, self.data = model, data

        def __call__(self, trainer):
            chainer.report({'validation/n': len(self.data)})


    def main():
        args = argparse.ArgumentParser().parse_args()
        train, test = chainer.datasets.get_mnist()
        model = L.Classifier(L.Linear(None, 10))
        opt = chainer.optimizers.Adam()
        opt.setup(model)
        it = chainer.iterators.SerialIterator(train, 32)
        test_it = chainer.iterators.SerialIterator(test, 32, repeat=False, shuffle=False)
        trainer = training.Trainer(training.StandardUpdater(it, opt), (1, 'epoch'))
        trainer.extend(extensions.Evaluator(test_it, model))
        trainer.extend(Coverage(model, test))
        trainer.extend(Coverage(model, train))
        trainer.run()


    main()
    """
)


def _main_body(output: str) -> list[str]:
    tree = ast.parse(output)
    main = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "main")
    return [ast.unparse(s) for s in main.body]


def test_the_extension_gets_the_whole_test_set_on_rank_0_and_the_evaluator_the_shard() -> None:
    result = convert_source(SCRIPT, "train.py")
    assert result.error is None, result.error
    body = _main_body(result.output or "")
    copy = body.index("test_whole = test")
    assert body[copy + 1 : copy + 3] == [
        "train = mn.scatter_dataset(train, comm, shuffle=True)",
        "test = mn.scatter_dataset(test, comm)",
    ]
    assert "if comm.rank == 0:\n    trainer.extend(Coverage(model, test_whole))" in body
    # the training set is the rank's own share: an extension reading it is left as it is
    assert "trainer.extend(Coverage(model, train))" in body
    said = [e for e in result.entries if e.step == "whole-set-extension"]
    assert [e.severity for e in said] == ["changed"]


def test_the_output_is_a_fixed_point() -> None:
    first = convert_source(SCRIPT, "train.py").output or ""
    assert convert_source(first, "train.py").output == first


def test_noqa_leaves_the_extension_with_the_shard() -> None:
    source = SCRIPT.replace(
        "trainer.extend(Coverage(model, test))",
        "trainer.extend(Coverage(model, test))  # noqa: MN816",
    )
    body = _main_body(convert_source(source, "train.py").output or "")
    assert "test_whole = test" not in body
    assert "trainer.extend(Coverage(model, test))" in body
