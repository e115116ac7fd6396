"""create_channel_parallel_model (what --model-parallel makes of a model class the converter
leaves alone) splits exactly the splittable convolutions and computes what the original does."""

from __future__ import annotations

import pytest

from tests.support.mpirun import run_ranks

RANKS = """
import json
import numpy as np
import chainer
import chainer.links as L
from mnify import runtime as mn

comm = mn.create_communicator("flat")
np.random.seed(0)


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(1, 4, 3, pad=1)
            self.lazy = L.Convolution2D(None, 4, 1)
            self.narrow = L.Convolution2D(4, 1, 1)
            self.seq = chainer.Sequential(L.Convolution2D(1, 6, 1), chainer.functions.relu)

    def forward(self, x):
        return self.narrow(self.lazy(self.c1(x))) + chainer.functions.sum(
            self.seq(x), axis=1, keepdims=True
        )


original = Net()
converted = mn.links.create_channel_parallel_model(original, comm)
x = np.random.RandomState(1).randn(2, 1, 5, 5).astype(np.float32)
got = converted(x).array
original(x)  # initialise the lazy layer, then give it the converted copy's weights
original.lazy.W.array[...] = converted.lazy.W.array
original.lazy.b.array[...] = converted.lazy.b.array
want = original(x).array
kinds = {name: type(link).__name__ for name, link in converted.namedlinks(skipself=True)}
print("RESULT " + json.dumps({
    "kinds": kinds,
    "close": bool(np.allclose(want, got, rtol=1e-5, atol=1e-6)),
    "original_untouched": type(original.c1).__name__,
}))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_splits_the_splittable_convolutions_and_keeps_the_function(n: int) -> None:
    import json

    run = run_ranks(n, RANKS, timeout=180)
    for rank in range(n):
        line = next(x for x in run.rank_lines(rank) if x.startswith("RESULT "))
        result = json.loads(line.removeprefix("RESULT "))
        assert result["kinds"] == {
            "/c1": "ParallelConvolution2D",
            "/lazy": "Convolution2D",  # input channels unknown before the first batch
            "/narrow": "Convolution2D",  # one output channel cannot be divided
            "/seq": "Sequential",
            "/seq/0": "ParallelConvolution2D",
        }, run.describe()
        assert result["close"], run.describe()
        assert result["original_untouched"] == "Convolution2D"
