"""Issue 31, item 6: the report never lists what the conversion handled, and the converter's
output lints clean of it. A first-use cache helper (builds and saves a file when it is missing,
then loads it) runs on rank 0 and its result is broadcast; lint of the output must not call its
save an MN402 "every rank saves to the same file", and the report must not list one."""

from __future__ import annotations

import textwrap

from mnify.lint import lint_source
from tests.convert.converting import convert

CACHED = textwrap.dedent(
    """\
    import argparse
    import os

    import numpy as np
    import chainer
    import chainer.links as L
    from chainer import training


    def load_features(cache):
        if not os.path.exists(cache):
            x = np.random.rand(100, 4).astype(np.float32)
            y = np.zeros(100, np.int32)
            np.savez(cache, x=x, y=y)
        saved = np.load(cache)
        return saved['x'], saved['y']


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--gpu', type=int, default=-1)
        parser.add_argument('--cache', default='features.npz')
        args = parser.parse_args()
        x, y = load_features(args.cache)
        train = chainer.datasets.TupleDataset(x, y)
        model = L.Classifier(L.Linear(4, 2))
        optimizer = chainer.optimizers.Adam()
        optimizer.setup(model)
        it = chainer.iterators.SerialIterator(train, 10)
        updater = training.updaters.StandardUpdater(it, optimizer)
        trainer = training.Trainer(updater, (1, 'epoch'))
        trainer.run()


    if __name__ == '__main__':
        main()
    """
)


def test_a_cache_helper_broadcast_from_rank_0_is_no_needs_person_item() -> None:
    result = convert(CACHED)
    output = result.output or ""
    assert "comm.bcast_obj(load_features(args.cache) if comm.rank == 0 else None)" in output
    assert [e for e in result.entries if e.severity == "needs-person"] == []
    assert [d.code for d in lint_source(output, "train.py")] == []
