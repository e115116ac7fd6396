"""The numpy twins of the CUDA kernels against straightforward numpy references.

The references are written the obvious way (loops over arrays and ranks, float64 math); the
twins are what CPU ranks run and what the GPU kernels are checked against.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mnify.runtime import kernels

FLOATS = [np.float16, np.float32, np.float64]
# odd sizes, a scalar, an empty array, a 4-D conv weight
SHAPES = [(7,), (), (0,), (3, 5), (4, 3, 3, 3), (1,), (129,)]


def _arrays(dtype: type, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def _tol(dtype: object) -> dict[str, float]:
    if np.dtype(dtype) == np.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    if np.dtype(dtype) == np.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    return {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
@pytest.mark.parametrize("scale", [1.0, 0.25, 1 / 3])
def test_pack_matches_reference(src: type, dst: type, scale: float) -> None:
    rng = np.random.default_rng(0)
    arrays = _arrays(src, rng)
    total = sum(a.size for a in arrays)
    out = np.full(total + 5, 7, dtype=dst)  # tail must stay untouched
    kernels.pack(arrays, out, scale)
    ref = np.concatenate([a.astype(np.float64).ravel() * scale for a in arrays]).astype(dst)
    np.testing.assert_allclose(out[:total], ref, **_tol(dst))
    assert (out[total:] == 7).all()


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3])
def test_unpack_inverts_pack(src: type, dst: type, scale: float) -> None:
    rng = np.random.default_rng(1)
    arrays = _arrays(dst, rng)
    total = sum(a.size for a in arrays)
    buf = rng.standard_normal(total).astype(src)
    kernels.unpack(buf, arrays, scale)
    offset = 0
    for a in arrays:
        ref = (buf[offset : offset + a.size].astype(np.float64) * scale).astype(dst)
        np.testing.assert_allclose(a.ravel(), ref, **_tol(dst))
        offset += a.size


def test_pack_rejects_short_buffer() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        kernels.pack([np.zeros(5, np.float32)], np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="at least 5"):
        kernels.unpack(np.zeros(4, np.float32), [np.zeros(5, np.float32)])


def test_pack_of_nothing_is_a_no_op() -> None:
    out = np.ones(3, np.float32)
    kernels.pack([], out, 0.5)
    kernels.unpack(out, [], 0.5)
    assert (out == 1).all()


def _ref_channel_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = x.shape[1]
    xs = np.moveaxis(x.astype(np.float64), 1, 0).reshape(c, -1)
    return xs.sum(axis=1), (xs * xs).sum(axis=1)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "shape", [(5, 3, 7, 9), (4, 6), (2, 5, 3, 3, 3), (1, 1, 1, 1), (0, 4, 2, 2)]
)
def test_channel_sums(dtype: type, shape: tuple[int, ...]) -> None:
    x = (np.random.default_rng(2).standard_normal(shape) + 0.5).astype(dtype)
    total, sumsq = kernels.channel_sums(x)
    acc = kernels.accumulate_dtype(dtype)
    assert total.dtype == acc and sumsq.dtype == acc
    assert total.shape == (shape[1],) and sumsq.shape == (shape[1],)
    ref_sum, ref_sq = _ref_channel_sums(x)
    tol = {"rtol": 1e-5, "atol": 1e-4} if acc == np.float32 else {"rtol": 1e-12, "atol": 1e-10}
    np.testing.assert_allclose(total, ref_sum, **tol)
    np.testing.assert_allclose(sumsq, ref_sq, **tol)


def test_channel_sums_f16_does_not_overflow() -> None:
    # 70000 values of 1.0: the sum exceeds float16's max (65504); float32 accumulation is exact.
    x = np.ones((70, 2, 1000), np.float16)
    total, sumsq = kernels.channel_sums(x)
    assert total.tolist() == [70000.0, 70000.0] and sumsq.tolist() == [70000.0, 70000.0]


def test_channel_sums_non_contiguous_input() -> None:
    x = np.random.default_rng(3).standard_normal((4, 6, 5)).astype(np.float32)[:, ::2]
    total, sumsq = kernels.channel_sums(x)
    ref_sum, ref_sq = _ref_channel_sums(x)
    np.testing.assert_allclose(total, ref_sum, rtol=1e-5)
    np.testing.assert_allclose(sumsq, ref_sq, rtol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(5, 3, 7, 9), (4, 6), (0, 2, 3)])
def test_bn_backward_sums(dtype: type, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(4)
    gy = rng.standard_normal(shape).astype(dtype)
    xh = rng.standard_normal(shape).astype(dtype)
    sum_gy, sum_gy_xhat = kernels.bn_backward_sums(gy, xh)
    c = shape[1]
    g64 = np.moveaxis(gy.astype(np.float64), 1, 0).reshape(c, -1)
    x64 = np.moveaxis(xh.astype(np.float64), 1, 0).reshape(c, -1)
    acc = kernels.accumulate_dtype(dtype)
    assert sum_gy.dtype == acc and sum_gy_xhat.dtype == acc
    tol = {"rtol": 1e-5, "atol": 1e-4} if acc == np.float32 else {"rtol": 1e-12, "atol": 1e-10}
    np.testing.assert_allclose(sum_gy, g64.sum(axis=1), **tol)
    np.testing.assert_allclose(sum_gy_xhat, (g64 * x64).sum(axis=1), **tol)


def test_bn_backward_sums_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="same shape|both be"):
        kernels.bn_backward_sums(np.zeros((2, 3)), np.zeros((2, 4)))


def _ref_gather(
    blocks: list[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """What an allgather of each rank's output gives (flat) and the full tensor it means."""
    flat = np.concatenate([b.ravel() for b in blocks])
    return flat, np.concatenate(blocks, axis=1)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    ("counts", "spatial"),
    [([2, 2, 1], (3, 5)), ([1, 3], (4, 4)), ([3], (2, 2)), ([1, 0, 2], (3,)), ([2, 1, 1], ())],
)
def test_gather_and_split_channels(
    dtype: type, counts: list[int], spatial: tuple[int, ...]
) -> None:
    n = 3
    rng = np.random.default_rng(5)
    blocks = [rng.standard_normal((n, c, *spatial)).astype(dtype) for c in counts]
    flat, full = _ref_gather(blocks)

    out = kernels.gather_channels(flat, counts, n, spatial)
    assert out.shape == (n, sum(counts), *spatial) and out.dtype == flat.dtype
    np.testing.assert_array_equal(out, full)

    given = np.full(full.shape, -1, dtype)
    assert kernels.gather_channels(flat, counts, n, spatial, given) is given
    np.testing.assert_array_equal(given, full)

    back = kernels.split_channels(full, counts)
    np.testing.assert_array_equal(back, flat)
    into = np.zeros(flat.size + 3, dtype)
    assert kernels.split_channels(full, counts, into) is into
    np.testing.assert_array_equal(into[: flat.size], flat)
    assert (into[flat.size :] == 0).all()


def test_gather_channels_validates() -> None:
    with pytest.raises(ValueError, match="at least"):
        kernels.gather_channels(np.zeros(5), [1, 1], 1, (3,))
    with pytest.raises(ValueError, match="shaped"):
        kernels.gather_channels(np.zeros(6), [1, 1], 1, (3,), np.zeros((1, 3, 3)))
    with pytest.raises(ValueError, match="counts"):
        kernels.split_channels(np.zeros((1, 3, 2)), [1, 1])


def test_split_then_alltoall_shape_arithmetic() -> None:
    # the block of rank r in split_channels' output has exactly n * counts[r] * prod(spatial) items
    counts, n, spatial = [3, 2, 2], 2, (5, 3)
    x = np.arange(n * sum(counts) * math.prod(spatial), dtype=np.float64).reshape(
        n, sum(counts), *spatial
    )
    flat = kernels.split_channels(x, counts)
    offset, c0 = 0, 0
    for c in counts:
        size = n * c * math.prod(spatial)
        np.testing.assert_array_equal(
            flat[offset : offset + size].reshape(n, c, *spatial), x[:, c0 : c0 + c]
        )
        offset, c0 = offset + size, c0 + c


def test_pack_unpack_non_contiguous_and_scalar_arrays() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    arrays = [base[:, ::2], np.full((), 5.0, np.float32), base.T]
    total = sum(a.size for a in arrays)
    buf = np.empty(total, np.float32)
    kernels.pack(arrays, buf, 2.0)
    expect = np.concatenate([a.ravel() * 2.0 for a in arrays]).astype(np.float32)
    np.testing.assert_array_equal(buf, expect)
    kernels.unpack(buf, arrays, 0.5)  # writes through the strided views into base
    np.testing.assert_array_equal(base, np.arange(24, dtype=np.float64).reshape(4, 6))
    assert arrays[1] == 5.0


@pytest.mark.parametrize("seed", range(6))
def test_gather_split_random_layouts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(1, 6))
    counts = [int(c) for c in rng.integers(0, 4, size=ranks)]
    if sum(counts) == 0:
        counts[0] = 1
    n = int(rng.integers(1, 4))
    spatial = tuple(int(d) for d in rng.integers(1, 5, size=int(rng.integers(0, 3))))
    blocks = [rng.standard_normal((n, c, *spatial)) for c in counts]
    flat = np.concatenate([b.ravel() for b in blocks])
    full = np.concatenate(blocks, axis=1)
    np.testing.assert_array_equal(kernels.gather_channels(flat, counts, n, spatial), full)
    np.testing.assert_array_equal(kernels.split_channels(full, counts), flat)
