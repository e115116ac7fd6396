"""Issue 31, item 4: datasets every rank builds and slices by index instead of receiving rank
0's pickled share: loading that changes ``sys.path`` or imports a module by name (rank 1 could
not unpickle a class only rank 0 imported), and datasets that only load lazily (Chainer's file
readers, a ``DatasetMixin`` reading files by index, a list of paths). Asserted on the output's
AST and the report."""

from __future__ import annotations

import ast
import textwrap

from tests.convert.converting import convert

HEAD = """\
import argparse
import glob
import importlib
import os
import sys

import numpy as np
import chainer
from chainer import training
from chainer.training import extensions
"""

MAIN = """\
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--gpu', type=int, default=-1)
    parser.add_argument('--root', default='data')
    args = parser.parse_args()
    model = chainer.links.Classifier(chainer.links.Linear(None, 10))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
{load}
    train_iter = chainer.iterators.SerialIterator(train, 16)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (1, 'epoch'))
    trainer.run()


main()
"""


def script(load: str, helpers: str = "") -> str:
    body = textwrap.indent(textwrap.dedent(load), "    ").rstrip("\n")
    return HEAD + "\n\n" + textwrap.dedent(helpers) + "\n\n" + MAIN.format(load=body)


def _main(output: str) -> list[str]:
    main = next(
        n for n in ast.parse(output).body if isinstance(n, ast.FunctionDef) and n.name == "main"
    )
    return [ast.unparse(s) for s in main.body]


SLICED = "train = chainer.datasets.SubDataset(train, *mn.scatter_index(len(train), comm))"


def _sliced_on_every_rank(output: str) -> None:
    """Every rank loads ``train`` (no rank check around the loading) and keeps its slice."""
    body = _main(output)
    assert SLICED in body
    assert not any("scatter_dataset" in s for s in body)
    assert not any(s.startswith("if comm.rank == 0") and "train" in s for s in body)
    assert body.index(SLICED) < next(i for i, s in enumerate(body) if "SerialIterator" in s)


def _said(result: object) -> list[str]:
    return [e.message for e in result.entries if e.step == "dataset"]  # type: ignore[attr-defined]


def test_a_dataset_class_imported_by_name_after_a_sys_path_insert_is_sliced_by_index() -> None:
    helpers = """\
    def load_module(path, name):
        sys.path.insert(0, os.path.dirname(path))
        module = importlib.import_module(os.path.basename(path)[:-3])
        return getattr(module, name)


    def load_dataset(conf):
        cls = load_module(conf['file'], conf['name'])
        return cls(**conf['args'])
    """
    result = convert(
        script("train = load_dataset({'file': 'd/toy.py', 'name': 'Toy', 'args': {}})\n", helpers)
    )
    _sliced_on_every_rank(result.output or "")
    assert any("imports a module by name" in m for m in _said(result))


def test_a_lazy_image_dataset_is_built_on_every_rank() -> None:
    result = convert(
        script(
            "train = chainer.datasets.LabeledImageDataset(os.path.join(args.root, 'train.txt'), args.root)\n"
        )
    )
    _sliced_on_every_rank(result.output or "")


def test_a_dataset_mixin_reading_its_files_by_index_is_built_on_every_rank() -> None:
    helpers = """\
    class NpyFiles(chainer.dataset.DatasetMixin):
        def __init__(self, paths):
            self.paths = paths

        def __len__(self):
            return len(self.paths)

        def get_example(self, i):
            x = np.load(self.paths[i])
            return x.astype(np.float32), np.int32(0)
    """
    result = convert(
        script("train = NpyFiles(sorted(glob.glob(os.path.join(args.root, '*.npy'))))\n", helpers)
    )
    _sliced_on_every_rank(result.output or "")


def test_a_list_of_paths_is_built_on_every_rank() -> None:
    result = convert(script("train = sorted(glob.glob(os.path.join(args.root, '*.png')))\n"))
    _sliced_on_every_rank(result.output or "")


def test_an_in_memory_dataset_is_still_loaded_by_rank_0_and_scattered() -> None:
    result = convert(script("train, test = chainer.datasets.get_mnist()\n"))
    body = _main(result.output or "")
    assert "train = mn.scatter_dataset(train, comm, shuffle=True)" in body
    assert SLICED not in body
