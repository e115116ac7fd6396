"""Issue 31, item 5: a global seed every rank sets alike is kept for what is built before
training and made per rank right before training starts (asserted on the output's AST and the
report; the corpus's gan_resblocks project checks under ``--verify`` that the ranks then draw
different generator noise, and loop_iterable_batch_class runs a reseeded script on 2 ranks)."""

from __future__ import annotations

import ast
import textwrap

from mnify.lint import lint_source
from tests.convert.converting import convert

IMPORTS = """\
import argparse
import random
import time

import numpy as np
import chainer
import chainer.links as L
from chainer import training
"""
MAIN = """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
"""


def script(body: str, helpers: str = "") -> str:
    """The imports, ``helpers``, then ``main()``: the argparse head and ``body``, and its call."""
    main = MAIN + textwrap.indent(textwrap.dedent(body), "    ")
    return IMPORTS + "\n\n" + textwrap.dedent(helpers) + "\n\n" + main + "\n\nmain()\n"


def _main_body(output: str) -> list[str]:
    main = next(
        n for n in ast.parse(output).body if isinstance(n, ast.FunctionDef) and n.name == "main"
    )
    return [ast.unparse(s).splitlines()[0] for s in main.body]


TRAINER = """\
np.random.seed(args.seed)
random.seed(args.seed)
model = L.Classifier(L.Linear(None, 3))
optimizer = chainer.optimizers.Adam()
optimizer.setup(model)
train, test = chainer.datasets.get_mnist()
train_iter = chainer.iterators.SerialIterator(train, 32)
updater = training.updaters.StandardUpdater(train_iter, optimizer)
trainer = training.Trainer(updater, (1, 'epoch'))
trainer.run()
"""


def test_seed_is_kept_and_set_again_with_the_rank_right_before_training() -> None:
    result = convert(script(TRAINER))
    body = _main_body(result.output or "")
    run = body.index("trainer.run()")
    assert body[run - 2 : run] == [
        "np.random.seed(args.seed + comm.rank)",
        "random.seed(args.seed + comm.rank)",
    ]
    assert body.index("np.random.seed(args.seed)") < body.index("optimizer.setup(model)") < run
    said = [e for e in result.entries if e.step == "seeds"]
    assert [(e.severity, e.code) for e in said] == [("changed", "MN904")] * 2


def test_lint_finds_the_common_seed_in_the_input_and_nothing_in_the_output() -> None:
    """Lint and convert agree: the output's common seed is followed by a per-rank one."""
    result = convert(script(TRAINER))
    assert [d.line for d in lint_source(script(TRAINER), "t.py", select=["MN904"])] == []
    distributed = script(TRAINER).replace(
        "args = parser.parse_args()\n",
        "args = parser.parse_args()\n    comm = chainermn.create_communicator()\n",
    )
    found = lint_source("import chainermn\n" + distributed, "t.py", select=["MN904"])
    assert len(found) == 2  # the input, made distributed by hand, seeds alike on every rank
    assert lint_source(result.output or "", "t.py", select=["MN904"]) == []


def test_a_second_conversion_adds_no_second_reseed() -> None:
    convert(script(TRAINER), idempotent=True)


def test_a_seeding_helper_is_called_again_with_the_rank_before_a_hand_loop() -> None:
    helper = """\
    def set_random_seed(seed):
        random.seed(seed)
        np.random.seed(seed)
    """
    body = """\
    set_random_seed(args.seed * 2)
    x = np.random.rand(100, 3).astype(np.float32)
    t = np.zeros(100, np.int32)
    model = L.Classifier(L.Linear(3, 2))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    for i in range(0, len(x), 10):
        optimizer.update(model, x[i:i + 10], t[i:i + 10])
    """
    result = convert(script(body, helper))
    body_out = _main_body(result.output or "")
    loop = next(i for i, s in enumerate(body_out) if s.startswith("for i in"))
    assert body_out[loop - 1] == "set_random_seed(args.seed * 2 + comm.rank)"
    assert body_out.index("optimizer.setup(model)") < loop - 1


def test_a_seed_set_under_a_branch_needs_a_person_with_its_line() -> None:
    source = script(
        TRAINER.replace(
            "np.random.seed(args.seed)\n", "if args.seed >= 0:\n    np.random.seed(args.seed)\n"
        ).replace("random.seed(args.seed)\n", "", 1)
    )
    result = convert(source)
    needs = [e for e in result.entries if e.step == "seeds" and e.severity == "needs-person"]
    line = source.splitlines().index("        np.random.seed(args.seed)") + 1
    assert [e.line for e in needs] == [line]
    assert "np.random.seed(args.seed + comm.rank)" not in (result.output or "")


def test_a_seed_read_from_the_clock_is_left_alone() -> None:
    result = convert(
        script(TRAINER.replace("np.random.seed(args.seed)", "np.random.seed(int(time.time()))"))
    )
    assert [e.severity for e in result.entries if e.step == "seeds"] == ["changed"]  # random's


def test_under_global_data_the_report_says_runs_at_other_sizes_differ() -> None:
    result = convert(script(TRAINER), data="global")
    said = [e.message for e in result.entries if e.step == "seeds" and e.severity == "changed"]
    assert said and all("different numbers of ranks differ" in m for m in said)
    assert "np.random.seed(args.seed + comm.rank)" in _main_body(result.output or "")


def test_a_seed_in_the_main_guard_of_a_module_level_script_is_reseeded() -> None:
    """``if __name__ == '__main__':`` is the script itself, not a branch some runs skip."""
    body = textwrap.dedent(MAIN.split("\n", 1)[1]) + TRAINER
    source = IMPORTS + "\n\nif __name__ == '__main__':\n" + textwrap.indent(body, "    ")
    result = convert(source)
    guard = next(n for n in ast.parse(result.output or "").body if isinstance(n, ast.If))
    lines = [ast.unparse(s) for s in guard.body]
    run = lines.index("trainer.run()")
    assert lines[run - 2 : run] == [
        "np.random.seed(args.seed + comm.rank)",
        "random.seed(args.seed + comm.rank)",
    ]
    assert not [e for e in result.entries if e.step == "seeds" and e.severity == "needs-person"]
