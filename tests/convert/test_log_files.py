"""Issue 22, part 2: logging file handlers -- rank 0 keeps the file, the other ranks log to the
console (asserted on the output's AST; the corpus script loop_logging_file_handlers runs it on
2 ranks and checks rank 1 writes no log)."""

from __future__ import annotations

import ast

from mnify.converter import convert_source

SCRIPT = """\
import argparse
import logging
import logging.handlers

import chainer
import chainer.links as L
from chainer import training


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    args = parser.parse_args()
    logging.basicConfig(filename='train.log', level=logging.INFO)
    logger = logging.getLogger('train')
    fh = logging.handlers.RotatingFileHandler('debug.log', maxBytes=10000)
    logger.addHandler(fh)
    logger.addHandler(logging.FileHandler('errors.log'))
    per_rank = logging.FileHandler('rank%d.log' % 0)
    train, test = chainer.datasets.get_mnist()
    model = L.Classifier(L.Linear(784, 10))
    opt = chainer.optimizers.Adam()
    opt.setup(model)
    it = chainer.iterators.SerialIterator(train, 100)
    updater = training.StandardUpdater(it, opt, device=args.gpu)
    training.Trainer(updater, (1, 'epoch')).run()


main()
"""

RANK0 = "comm.rank == 0"


def _if_exps(tree: ast.AST) -> list[ast.IfExp]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.IfExp)]


def test_file_handlers_are_rank_0_only_and_the_others_log_to_the_console() -> None:
    result = convert_source(SCRIPT, "train.py")
    assert result.error is None, result.error
    tree = ast.parse(result.output or "")
    picks = {
        (ast.unparse(e.body), ast.unparse(e.orelse))
        for e in _if_exps(tree)
        if ast.unparse(e.test) == RANK0
    }
    assert ("'train.log'", "None") in picks  # basicConfig(filename=...)
    assert (
        "logging.handlers.RotatingFileHandler('debug.log', maxBytes=10000)",
        "logging.StreamHandler()",
    ) in picks
    assert ("logging.FileHandler('errors.log')", "logging.StreamHandler()") in picks
    # 'rank%d.log' % 0 names no rank: one file for all, so rank 0 keeps it too
    assert ("logging.FileHandler('rank%d.log' % 0)", "logging.StreamHandler()") in picks
    assert len(picks) == 4
    said = [e for e in result.entries if e.step == "log-file" and e.severity == "changed"]
    assert len(said) == 4


def test_log_file_set_up_before_the_communicator_needs_a_person() -> None:
    early = SCRIPT.replace(
        "def main():\n", "logging.basicConfig(filename='all.log')\n\n\ndef main():\n"
    )
    result = convert_source(early, "train.py")
    needs = [e for e in result.entries if e.step == "log-file" and e.severity == "needs-person"]
    assert [e.line for e in needs] == [10]  # the basicConfig line, above main
