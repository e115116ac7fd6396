"""Rank script: ParallelConvolution2D equals one Convolution2D holding the concatenated weights.

For channel counts that divide the number of ranks and that do not (and one where a rank owns no
channel), checks the output and the gradients of input, weight slice and bias slice against a
plain ``Convolution2D`` (relative 1e-5), a two-layer stack (the middle layer's input gradient is
all-reduced), initialisation from the same seed, lazy ``in_channels``, and the whole-layer
helpers. Prints ``PASS <name>`` per check (tests/support/rank_checks).
"""

from __future__ import annotations

import os

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify.runtime.errors import CollectiveMismatch
from mnify.runtime.links import ParallelConvolution2D
from tests.support.rank_checks import assert_close, make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size
V = chainer.Variable
RTOL, ATOL = 1e-5, 1e-6


def data(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, shape).astype(np.float32)


Pair = int | tuple[int, int]


def check_layer(
    name: str, in_ch: int, out_ch: int, ksize: Pair, stride: Pair, pad: Pair, dilate: Pair = 1
) -> None:
    np.random.seed(out_ch)  # the same reference layer on every rank
    bias = data(1, (out_ch,))
    conv = L.Convolution2D(in_ch, out_ch, ksize, stride, pad, initial_bias=bias, dilate=dilate)
    par = ParallelConvolution2D(comm, in_ch, out_ch, ksize, stride, pad, dilate=dilate)
    par.load_full_weights(conv.W.array, conv.b.array)
    counts = [out_ch // size + (1 if r < out_ch % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    own = slice(start, start + counts[rank])
    # attributes are the full layer's; the parameters hold only this rank's slice
    assert par.in_channels == in_ch and par.out_channels == out_ch, (
        par.in_channels,
        par.out_channels,
    )
    assert par.W.shape == (counts[rank], *conv.W.shape[1:]), par.W.shape
    assert par.b is not None and par.b.shape == (counts[rank],)

    x = data(2, (2, in_ch, 7, 6))
    x_ref, x_par = V(x.copy()), V(x.copy())
    y_ref, y_par = conv(x_ref), par(x_par)
    assert_close(f"{name} forward", y_par.array, y_ref.array, RTOL, ATOL)
    w = data(3, y_ref.shape)
    conv.cleargrads()  # fresh parameters' grads start as NaN until cleared (as optimizers do)
    par.cleargrads()
    F.sum(y_ref * w).backward()
    F.sum(y_par * w).backward()
    assert_close(f"{name} grad x", x_par.grad, x_ref.grad, RTOL, ATOL)
    assert_close(f"{name} grad W", par.W.grad, conv.W.grad[own], RTOL, ATOL)
    assert_close(f"{name} grad b", par.b.grad, conv.b.grad[own], RTOL, ATOL)
    passed(name)


# 4 channels divide 2 ranks, not 3; 5 divide neither; 2 on 3 ranks leaves rank 2 without one.
check_layer("out4", 3, 4, 3, 1, 1)
check_layer("out5", 3, 5, 3, 2, 0)
check_layer("out2", 4, 2, 1, 1, 0)
check_layer("out7_rect_dilated", 2, 7, (3, 2), (2, 1), (1, 0), dilate=(2, 1))

# ---------------------------------------------------------------- two layers, seeded init
# Same seed on every rank and in the reference: the parallel layers start from the slices of
# what Convolution2D would draw, and the middle input gradient goes through the all-reduce.
np.random.seed(123)
ref1 = L.Convolution2D(3, 5, 3, pad=1)
ref2 = L.Convolution2D(5, 4, 3, pad=1, initial_bias=chainer.initializers.Normal(0.5))
np.random.seed(123)
par1 = ParallelConvolution2D(comm, 3, 5, 3, pad=1)
par2 = ParallelConvolution2D(comm, 5, 4, 3, pad=1, initial_bias=chainer.initializers.Normal(0.5))
full_W1, full_b1 = par1.full_weights()
full_W2, full_b2 = par2.full_weights()
assert_close("seeded init W1", full_W1, ref1.W.array, 0, 0)
assert_close("seeded init b1", full_b1, ref1.b.array, 0, 0)
assert_close("seeded init W2", full_W2, ref2.W.array, 0, 0)
assert_close("seeded init b2", full_b2, ref2.b.array, 0, 0)
passed("seeded_init")

x = data(4, (3, 3, 5, 5))
x_ref, x_par = V(x.copy()), V(x.copy())
y_ref = ref2(F.relu(ref1(x_ref)))
y_par = par2(F.relu(par1(x_par)))
assert_close("stack forward", y_par.array, y_ref.array, RTOL, ATOL)
w = data(5, y_ref.shape)
for link in (ref1, ref2, par1, par2):
    link.cleargrads()
F.sum(y_ref * w).backward()
F.sum(y_par * w).backward()
assert_close("stack grad x", x_par.grad, x_ref.grad, RTOL, ATOL)
for par, ref in ((par1, ref1), (par2, ref2)):
    own = par.local_slice()
    assert_close("stack grad W", par.W.grad, ref.W.grad[own], RTOL, ATOL)
    assert par.b is not None
    assert_close("stack grad b", par.b.grad, ref.b.grad[own], RTOL, ATOL)
passed("two_layers")

# data input without gradient (first layer): no input all-reduce; weight gradients still right
par1.cleargrads()
ref1.cleargrads()
F.sum(par1(x) * data(6, (3, 5, 5, 5))).backward()
F.sum(ref1(x) * data(6, (3, 5, 5, 5))).backward()
assert_close("data input grad W", par1.W.grad, ref1.W.grad[par1.local_slice()], RTOL, ATOL)
passed("data_input")

# ---------------------------------------------------------------- lazy in_channels, both spellings
np.random.seed(7)
ref = L.Convolution2D(None, 5, 3)
ref(np.zeros((1, 2, 4, 4), np.float32))
np.random.seed(7)
lazy = ParallelConvolution2D(comm, 5, 3)  # ksize third: in_channels inferred
assert lazy.in_channels is None and lazy.out_channels == 5 and lazy.W.array is None
lazy(np.zeros((1, 2, 4, 4), np.float32))
assert lazy.in_channels == 2
assert_close("lazy init W", lazy.full_weights()[0], ref.W.array, 0, 0)
np.random.seed(7)
lazy2 = ParallelConvolution2D(comm, None, 5, 3)
lazy2(np.zeros((1, 2, 4, 4), np.float32))
assert_close("lazy init W (None)", lazy2.full_weights()[0], ref.W.array, 0, 0)
passed("lazy_in_channels")

# ---------------------------------------------------------------- from_convolution, nobias, initialW array
np.random.seed(9)
conv = L.Convolution2D(2, 3, 2, nobias=True)
par = ParallelConvolution2D.from_convolution(comm, conv)
assert par.b is None
assert_close("from_convolution W", par.full_weights()[0], conv.W.array, 0, 0)
assert_close(
    "from_convolution forward", par(data(8, (1, 2, 3, 3))).array, conv(data(8, (1, 2, 3, 3))).array
)
byarray = ParallelConvolution2D(comm, 2, 3, 2, initialW=conv.W.array, initial_bias=np.arange(3.0))
assert_close("initialW array", byarray.full_weights()[0], conv.W.array, 0, 0)
assert byarray.b is not None
assert_close(
    "initial_bias array", byarray.full_weights()[1], np.arange(3.0, dtype=np.float32), 0, 0
)
passed("whole_layer_helpers")

# ---------------------------------------------------------------- per-rank snapshots
np.random.seed(21)
saved_layer = ParallelConvolution2D(comm, 3, 5, 3)
writer = chainer.serializers.DictionarySerializer()
saved_layer.serialize(writer)
snapshots = comm.allgather_obj(writer.target)  # every rank's "file"
restored = ParallelConvolution2D(comm, 3, 5, 3)
restored.serialize(chainer.serializers.NpzDeserializer(snapshots[rank]))
assert_close("snapshot W", restored.W.array, saved_layer.W.array, 0, 0)
try:
    restored.serialize(chainer.serializers.NpzDeserializer(snapshots[(rank + 1) % size]))
except ValueError as error:
    assert "snapshot" in str(error) and "per rank" in str(error), error
else:
    raise AssertionError("loading another rank's slice must fail")
passed("per_rank_snapshot")

# ---------------------------------------------------------------- float16 end to end
np.random.seed(11)
ref16 = L.Convolution2D(3, 5, 3, pad=1, initialW=chainer.initializers.Normal(0.3, dtype=np.float16))
ref16.b.array = ref16.b.array.astype(np.float16)
np.random.seed(11)
par16 = ParallelConvolution2D(
    comm, 3, 5, 3, pad=1, initialW=chainer.initializers.Normal(0.3, dtype=np.float16)
)
assert par16.b is not None
par16.b.array = par16.b.array.astype(np.float16)
x16 = data(12, (2, 3, 4, 4)).astype(np.float16)
xr, xp_ = V(x16.copy()), V(x16.copy())
yr, yp = ref16(xr), par16(xp_)
assert yp.dtype == np.float16
assert_close("fp16 forward", yp.array, yr.array, 1e-2, 1e-2)
w16 = data(13, yr.shape).astype(np.float16)
ref16.cleargrads()
par16.cleargrads()
F.sum(yr * w16).backward()
F.sum(yp * w16).backward()
assert xp_.grad.dtype == np.float16 and par16.W.grad.dtype == np.float16
assert_close("fp16 grad x", xp_.grad, xr.grad, 1e-2, 1e-2)
assert_close("fp16 grad W", par16.W.grad, ref16.W.grad[par16.local_slice()], 1e-2, 1e-2)
passed("float16")

# ---------------------------------------------------------------- diverged replicas fail loudly
# A layer's first call (every call under MNIFY_DEBUG=1) checks its input agrees on all ranks.
layer = ParallelConvolution2D(comm, 2, 3, 1)
diverged = np.full((1, 2, 2, 2), 1.0 if rank == size - 1 else 0.0, np.float32)
try:
    layer(diverged)
except CollectiveMismatch as error:
    assert f"rank(s) {size - 1} disagree" in str(error), error
else:
    raise AssertionError("different inputs on different ranks must be reported")
layer(np.ones((1, 2, 2, 2), np.float32))  # agreeing inputs pass
if os.environ.get("MNIFY_DEBUG") == "1":  # later calls are checked in debug mode only
    try:
        layer(diverged)
    except CollectiveMismatch:
        passed("debug_diverged_input")
passed("diverged_input")
