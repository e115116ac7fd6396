"""The dataset iterators a script builds, read from the facts: which calls construct one, the
dataset each reads, and whether it is a training iterator. The dataset step scatters those
datasets, the evaluator step finds the test iterators, the scaling and model-parallel steps
read the training ones (docs/design.md §1); a module of its own so that the steps share it
without importing one another.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as vocab
from mnify.program.facts import CallFact
from mnify.rewrites.context import FileContext
from mnify.syntax import argument_node


def dataset_arg(call: cst.Call) -> cst.Arg | None:
    """The argument an iterator takes its dataset from (first positional or ``dataset=``)."""
    return argument_node(call, 0, "dataset")


def dataset_name(call: cst.Call) -> str | None:
    """The name an iterator takes its dataset from (``SerialIterator(test, 32)``: ``test``), or
    None for a dataset given as an expression."""
    arg = dataset_arg(call)
    return arg.value.value if arg is not None and isinstance(arg.value, cst.Name) else None


def is_training_iterator(call: cst.Call) -> bool:
    """False for evaluation iterators: ``repeat=False`` (keyword or third positional)."""
    repeat: cst.BaseExpression | None = None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if len(positional) > 2:
        repeat = positional[2].value
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "repeat":
            repeat = arg.value
    return not (isinstance(repeat, cst.Name) and repeat.value == "False")


def is_user_iterator(qname: str) -> bool:
    """An iterator class of the user's or of another library (``WindowIterator``,
    ``ParallelSequentialIterator``): named like one, not Chainer's or the runtime's."""
    bare = qname.lstrip(".")
    return (
        bool(bare)
        and vocab.last(bare).endswith("Iterator")
        and not vocab.is_chainer_name(bare)
        and not vocab.is_runtime_name(bare, vocab.last(bare))
    )


def iterator_calls(ctx: FileContext) -> list[CallFact]:
    """Every construction of a dataset iterator, Chainer's or anyone's, not yet distributed."""
    return [
        c
        for c in ctx.facts.calls
        if (vocab.is_iterator(c.qname) or is_user_iterator(c.qname))
        and not (
            vocab.is_multi_node_iterator_factory(c.parent_qname) or vocab.is_scatter(c.parent_qname)
        )
    ]
