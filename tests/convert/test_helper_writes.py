"""Issue 22, part 2: writes the entry point reaches through the project's own code
(mnify/rewrites/helper_writes.py) and ``logging.config.dictConfig`` (MN814), asserted on the
output's AST. The fixture fixtures/convert/helper_module_writes runs them on 2 ranks
(tests/convert/test_e2e.py: rank 0 writes every file, rank 1 none)."""

from __future__ import annotations

import ast
import textwrap

from mnify.converter import ConvertOptions, convert_sources

HELPER = """\
import json
import os
import subprocess


def prepare_output_dir(args):
    os.makedirs(args.out)
    subprocess.call(['cp', 'train.py', args.out])
    with open(os.path.join(args.out, 'args.json'), 'w') as f:
        json.dump(vars(args), f)
    return args.out


def write_note(out):
    with open(os.path.join(out, 'note.txt'), 'w') as f:
        f.write('done')
"""

TRAIN = """\
import argparse
import json
import logging.config

import chainer
import chainer.links as L
from chainer import training

from helpers import prepare_output_dir, write_note


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, 2)

    def forward(self, x):
        return self.l1(x)

    def dump_shapes(self, path):
        with open(path, 'w') as f:
            json.dump({k: p.shape for k, p in self.namedparams()}, f)
# other classes

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--out', default='result')
    args = parser.parse_args()
    out = prepare_output_dir(args)
    logging.config.dictConfig(CONFIG)
    train, test = chainer.datasets.get_mnist()
    net = Net()
    model = L.Classifier(net)
    opt = chainer.optimizers.Adam()
    opt.setup(model)
    it = chainer.iterators.SerialIterator(train, 32)
    updater = training.StandardUpdater(it, opt)
    training.Trainer(updater, (1, 'epoch'), out=out).run()
    net.dump_shapes('shapes.json')
    write_note(out)


CONFIG = {'version': 1, 'handlers': {'f': {'class': 'logging.FileHandler', 'filename': 'a.log'}}}

if __name__ == '__main__':
    main()
"""

OTHER_CLASS_WITH_THE_SAME_METHOD = """

class Recorder(object):
    def dump_shapes(self, path):
        self.path = path
"""


def _convert(other_class: str = "", target: str = "mnify") -> dict[str, object]:
    sources = {
        "proj/helpers.py": HELPER,
        "proj/train.py": TRAIN.replace("# other classes\n", other_class),
    }
    results = convert_sources(sources, ConvertOptions(target=target))  # type: ignore[arg-type]
    for r in results:
        assert r.error is None, r.error
    by_path = {r.path: r for r in results}
    train = by_path["proj/train.py"]
    main = next(
        s
        for s in ast.parse(train.output or "").body
        if isinstance(s, ast.FunctionDef) and s.name == "main"
    )
    return {"main": [ast.unparse(s) for s in main.body], "results": results}


def _guarded(body: list[str], code: str) -> bool:
    """``code`` is a statement of an ``if comm.rank == 0:`` of the body (neighbours share one)."""
    for text in body:
        stmt = ast.parse(text).body[0]
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "comm.rank == 0":
            if code in [ast.unparse(s) for s in stmt.body]:
                return True
    return False


def test_a_helper_that_returns_what_it_made_runs_on_rank_0_and_every_rank_gets_it() -> None:
    body = _convert()["main"]
    assert isinstance(body, list)
    assert "out = comm.bcast_obj(prepare_output_dir(args) if comm.rank == 0 else None)" in body
    assert _guarded(body, "write_note(out)")  # a writes-only helper of another module


def test_a_writing_method_is_guarded_where_it_is_called() -> None:
    body = _convert()["main"]
    assert isinstance(body, list)
    assert _guarded(body, "net.dump_shapes('shapes.json')")


def test_a_method_name_two_classes_define_resolves_through_the_receivers_class() -> None:
    """Two classes define ``dump_shapes`` (only one writes): by name alone which one is called
    is not known, but ``net = Net()`` says it is Net's, which writes (program/effects.py)."""
    body = _convert(OTHER_CLASS_WITH_THE_SAME_METHOD)["main"]
    assert isinstance(body, list)
    assert _guarded(body, "net.dump_shapes('shapes.json')")


def test_dict_config_hands_its_configuration_to_rank0_log_files() -> None:
    body = _convert()["main"]
    assert isinstance(body, list)
    assert "logging.config.dictConfig(mn.rank0_log_files(CONFIG, comm))" in body


def test_dict_config_needs_a_person_under_chainermn() -> None:
    converted = _convert(target="chainermn")
    body, results = converted["main"], converted["results"]
    assert isinstance(body, list) and isinstance(results, list)
    assert "logging.config.dictConfig(CONFIG)" in body
    needs = [e for r in results for e in r.entries if e.severity == "needs-person"]
    assert any(e.step == "log-file" for e in needs), needs


def test_subprocess_in_a_helper_rank_0_runs_is_a_fork_hazard_in_the_helpers_file() -> None:
    results = _convert()["results"]
    assert isinstance(results, list)
    helper = next(r for r in results if r.path == "proj/helpers.py")
    hazards = [(e.line, e.code) for e in helper.entries if e.severity == "needs-person"]
    assert hazards == [(8, "MN203")]  # the subprocess.call line
    train = next(r for r in results if r.path == "proj/train.py")
    # the writes inside the guarded method are not reported as every rank's any more
    assert not [e for e in train.entries if e.severity == "needs-person" and e.code == "MN402"]


def test_the_output_is_a_fixed_point() -> None:
    results = _convert()["results"]
    assert isinstance(results, list)
    again = convert_sources({r.path: r.output or r.source for r in results}, ConvertOptions())
    for first, second in zip(results, again, strict=True):
        assert second.error is None
        assert (second.output or second.source) == (first.output or first.source)


def test_script_without_project_helpers_is_unchanged_by_this() -> None:
    """A plain dictConfig call in one file converts alone (no helper, no method)."""
    source = textwrap.dedent(
        """\
        import argparse
        import logging.config

        import chainer
        from chainer import training


        def main():
            args = argparse.ArgumentParser().parse_args()
            logging.config.dictConfig({'version': 1})
            train, test = chainer.datasets.get_mnist()
            model = chainer.links.Classifier(chainer.links.Linear(None, 10))
            opt = chainer.optimizers.Adam()
            opt.setup(model)
            it = chainer.iterators.SerialIterator(train, 32)
            training.Trainer(training.StandardUpdater(it, opt), (1, 'epoch')).run()


        main()
        """
    )
    result = convert_sources({"train.py": source}, ConvertOptions())[0]
    assert "logging.config.dictConfig(mn.rank0_log_files({'version': 1}, comm))" in (
        result.output or ""
    )


def test_a_helper_returning_the_file_it_opened_is_not_broadcast() -> None:
    """A file object cannot go to the other ranks: the call is left for a person."""
    helper = HELPER.replace(
        "    return args.out\n",
        "    log = open(os.path.join(args.out, 'train.log'), 'w')\n    return log\n",
    )
    results = convert_sources(
        {"proj/helpers.py": helper, "proj/train.py": TRAIN.replace("# other classes\n", "")},
        ConvertOptions(),
    )
    train = next(r for r in results if r.path == "proj/train.py")
    assert "bcast_obj" not in (train.output or "")
    assert "    out = prepare_output_dir(args)\n" in (train.output or "")
