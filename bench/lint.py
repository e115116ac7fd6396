"""Benchmark: `mnify lint` (all rules, one pass) against the bare cost of what it must do anyway,
libcst's parse plus QualifiedNameProvider resolution, on a directory of generated scripts.

    .venv/bin/python bench/lint.py [--files 200] [--repeat 3]

Prints CPU seconds (per file, the best of --repeat runs; jobs alternate file by file),
the ratio lint/baseline (goal <= 1.3) and files per second. Not a test: nothing here fails.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from mnify.lint import lint_source

SINGLE_GPU = """\
import argparse

import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.training import extensions


class {model}(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
{layers}
            self.out = L.Linear(None, n_out)

    def forward(self, x):
        h = x
{forward}
        return self.out(h)


{helpers}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--batchsize', '-b', type=int, default={batch})
    parser.add_argument('--epoch', '-e', type=int, default=20)
    parser.add_argument('--gpu', '-g', type=int, default=-1)
    parser.add_argument('--out', '-o', default='result')
    args = parser.parse_args()

    model = L.Classifier({model}(1000, 10))
    if args.gpu >= 0:
        chainer.backends.cuda.get_device_from_id(args.gpu).use()
        model.to_gpu()
    optimizer = chainer.optimizers.{optimizer}()
    optimizer.setup(model)
    train, test = chainer.datasets.get_mnist()
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)
    updater = training.updaters.StandardUpdater(train_iter, optimizer, device=args.gpu)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)
    trainer.extend(extensions.Evaluator(test_iter, model, device=args.gpu))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(['epoch', 'main/loss', 'validation/main/loss']))
    trainer.extend(extensions.ProgressBar())
    trainer.run()


if __name__ == '__main__':
    main()
"""

DISTRIBUTED = """\
import argparse

import chainer
import chainer.links as L
import chainermn
from chainer import training
from chainer.training import extensions


class {model}(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
{layers}
            self.out = L.Linear(None, n_out)

    def forward(self, x):
        h = x
{forward}
        return self.out(h)


{helpers}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--batchsize', '-b', type=int, default={batch})
    parser.add_argument('--communicator', default='pure_nccl')
    args = parser.parse_args()
    comm = chainermn.create_communicator(args.communicator)
    device = comm.intra_rank
    chainer.backends.cuda.get_device_from_id(device).use()
    model = L.Classifier({model}(1000, 10))
    model.to_gpu()
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.{optimizer}(), comm)
    optimizer.setup(model)
    if comm.rank == 0:
        train, test = chainer.datasets.get_mnist()
    else:
        train, test = None, None
    train = chainermn.scatter_dataset(train, comm, shuffle=True)
    test = chainermn.scatter_dataset(test, comm, shuffle=True)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)
    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (20, 'epoch'), out='result')
    evaluator = extensions.Evaluator(test_iter, model, device=device)
    trainer.extend(chainermn.create_multi_node_evaluator(evaluator, comm))
    if comm.rank == 0:
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(['epoch', 'main/loss']))
        trainer.extend(extensions.ProgressBar())
    trainer.run()


if __name__ == '__main__':
    main()
"""

HELPER = '''\
def {name}(xs, scale={scale}):
    """Helper {index}."""
    total = 0
    for i, x in enumerate(xs):
        if i % {mod} == 0:
            total += x * scale
        else:
            total -= x / (i + 1)
    return total
'''


def generate(directory: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` distinct scripts: single-GPU and distributed templates with varied sizes."""
    rng = random.Random(seed)
    paths = []
    for index in range(count):
        depth = rng.randint(2, 8)
        layers = "\n".join(f"            self.l{i} = L.Linear(None, n_units)" for i in range(depth))
        forward = "\n".join(f"        h = F.relu(self.l{i}(h))" for i in range(depth))
        helpers = "\n\n".join(
            HELPER.format(name=f"helper_{index}_{i}", index=i, scale=i + 1, mod=i + 2)
            for i in range(rng.randint(1, 6))
        )
        template = DISTRIBUTED if index % 2 else SINGLE_GPU
        source = template.format(
            model=f"MLP{index}",
            layers=layers,
            forward=forward.replace("F.relu", "chainer.functions.relu"),
            helpers=helpers,
            batch=rng.choice([32, 64, 100, 128]),
            optimizer=rng.choice(["Adam", "MomentumSGD", "SGD", "RMSprop"]),
        )
        path = directory / f"train_{index:03d}.py"
        path.write_text(source, encoding="utf-8")
        paths.append(path)
    return paths


def baseline(source: str) -> None:
    """What any libcst tool that resolves names pays: parse, wrap (copying), resolve."""
    MetadataWrapper(cst.parse_module(source)).resolve(QualifiedNameProvider)


def baseline_no_copy(source: str) -> None:
    """The same without MetadataWrapper's defensive copy (what lint_source does)."""
    MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True).resolve(QualifiedNameProvider)


def lint_all_rules(source: str) -> None:
    lint_source(source, "train.py", select=["ALL"])


def per_file_best(
    rounds: int, sources: list[str], jobs: dict[str, Callable[[str], None]]
) -> dict[str, float]:
    """Sum over files of each job's best CPU time for that file. Jobs alternate file by file
    and CPU time (not wall time) is measured, so other processes on a shared machine skew the
    comparison as little as possible."""
    best = {name: [float("inf")] * len(sources) for name in jobs}
    for _ in range(rounds):
        for index, source in enumerate(sources):
            for name, job in jobs.items():
                start = time.process_time()
                job(source)
                best[name][index] = min(best[name][index], time.process_time() - start)
    return {name: sum(times) for name, times in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = generate(Path(tmp), args.files)
        sources = [(p.name, p.read_text(encoding="utf-8")) for p in paths]
    findings = sum(len(lint_source(s, p, select=["ALL"])) for p, s in sources)
    lines = sum(s.count("\n") for _, s in sources)
    best = per_file_best(
        args.repeat,
        [source for _, source in sources],
        {"baseline": baseline, "baseline_no_copy": baseline_no_copy, "lint": lint_all_rules},
    )
    base, no_copy, lint = best["baseline"], best["baseline_no_copy"], best["lint"]
    n = len(sources)
    print(f"{n} scripts, {lines} lines, {findings} findings with --select ALL")
    print("CPU seconds, sum over files of the best of each file's runs:")
    print(f"parse + QualifiedNameProvider:           {base:.3f} s  ({n / base:.0f} files/s)")
    print(f"  the same without the wrapper's copy:   {no_copy:.3f} s  ({n / no_copy:.0f} files/s)")
    print(f"mnify lint, all rules:                   {lint:.3f} s  ({n / lint:.0f} files/s)")
    print(f"ratio lint / baseline: {lint / base:.2f}x (goal <= 1.30x)")
    print(f"ratio lint / baseline without copy: {lint / no_copy:.2f}x")


if __name__ == "__main__":
    main()
