"""The CUDA kernels against their numpy twins, on a GPU (skipped without CuPy and a device).

Each kernel runs on CuPy arrays and its result is compared with the numpy twin run on the same
data copied to the host: f16/f32/f64, odd sizes, empty arrays, scales, casts, layouts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mnify.runtime import kernels
from mnify.runtime.kernels import host

pytestmark = pytest.mark.gpu

FLOATS = [np.float16, np.float32, np.float64]
SHAPES = [(7,), (), (0,), (3, 5), (4, 3, 3, 3), (1,), (129,), (5000,), (2049,)]


def _cp() -> Any:
    import cupy  # type: ignore[import-not-found]

    return cupy


def _tol(dtype: Any) -> dict[str, float]:
    if np.dtype(dtype) == np.float16:
        return {"rtol": 1e-3, "atol": 1e-3}
    if np.dtype(dtype) == np.float32:
        return {"rtol": 1e-6, "atol": 1e-6}
    return {"rtol": 1e-13, "atol": 1e-13}


def test_every_kernel_compiles_on_this_device() -> None:
    from mnify.runtime.kernels import device, sources

    names = device.compile_all()
    assert len(names) == sum(len(v) for v in sources.NAME_EXPRESSIONS.values())


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
@pytest.mark.parametrize("scale", [1.0, 0.25, 1 / 3])
def test_pack_unpack_match_twins(src: Any, dst: Any, scale: float) -> None:
    cp = _cp()
    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal(s).astype(src) for s in SHAPES]
    total = sum(a.size for a in hosts)

    out_h = np.full(total + 3, 7, dtype=dst)
    host.pack(hosts, out_h, scale)
    out_d = cp.full(total + 3, 7, dtype=dst)
    kernels.pack([cp.asarray(a) for a in hosts], out_d, scale)
    np.testing.assert_allclose(cp.asnumpy(out_d), out_h, **_tol(dst))

    back_h = [np.zeros_like(a) for a in hosts]
    host.unpack(out_h, back_h, scale)
    back_d = [cp.zeros(a.shape, dtype=src) for a in hosts]
    kernels.unpack(cp.asarray(out_h), back_d, scale)
    for d, h in zip(back_d, back_h, strict=True):
        np.testing.assert_allclose(cp.asnumpy(d), h, **_tol(src))


def test_pack_mixed_dtypes_and_non_contiguous() -> None:
    cp = _cp()
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 10)).astype(np.float32)
    hosts = [
        rng.standard_normal(33).astype(np.float16),
        base[:, ::3],  # non-contiguous
        rng.standard_normal((2, 2)).astype(np.float64),
        np.arange(5, dtype=np.int32),  # no kernel for ints: generic path
    ]
    devs = [cp.asarray(h) if h.flags.c_contiguous else cp.asarray(base)[:, ::3] for h in hosts]
    total = sum(h.size for h in hosts)
    out_h = np.zeros(total, np.float32)
    host.pack(hosts, out_h, 0.5)
    out_d = cp.zeros(total, np.float32)
    kernels.pack(devs, out_d, 0.5)
    np.testing.assert_allclose(cp.asnumpy(out_d), out_h, rtol=1e-6, atol=1e-6)

    host.unpack(out_h * 3, hosts, 2.0)
    kernels.unpack(cp.asarray(out_h * 3), devs, 2.0)
    for d, h in zip(devs, hosts, strict=True):
        np.testing.assert_allclose(
            cp.asnumpy(d), h, **_tol(h.dtype if h.dtype.kind == "f" else np.float64)
        )


def test_pack_many_arrays_in_one_call_and_cached_plan() -> None:
    cp = _cp()
    sizes = [1, 2047, 2048, 2049, 0, 70001] * 30
    devs = [cp.arange(n, dtype=cp.float32) + i for i, n in enumerate(sizes)]
    buf = cp.empty(sum(sizes), cp.float32)
    for _ in range(2):  # second call hits the cached plan
        kernels.pack(devs, buf, 2.0)
        expect = np.concatenate(
            [(np.arange(n, dtype=np.float32) + i) * 2 for i, n in enumerate(sizes)]
        )
        np.testing.assert_array_equal(cp.asnumpy(buf), expect)
    # same pointers, new contents: the cached plan still reads the live data
    for d in devs:
        d *= -1
    kernels.pack(devs, buf, 1.0)
    np.testing.assert_array_equal(cp.asnumpy(buf), -expect / 2)


def test_prepared_pack_and_unpack_replay_the_current_contents() -> None:
    """A prepared copy is one launch per dtype group on every call, reading (or writing) the
    arrays as they are then -- strided ones included, through their contiguous twins."""
    cp = _cp()
    base = cp.arange(24, dtype=cp.float32).reshape(4, 6)
    devs = [cp.arange(5, dtype=cp.float32), base[:, ::2], cp.arange(3, dtype=cp.float16)]
    out = cp.zeros(5 + 12 + 3, cp.float32)
    pack = kernels.prepare_pack(devs, out, 0.5)
    for _ in range(2):
        for d in devs:
            d += 1
        pack()
        expect = np.zeros(out.size, np.float32)
        host.pack([cp.asnumpy(d) for d in devs], expect, 0.5)
        np.testing.assert_array_equal(cp.asnumpy(out), expect)
    unpack = kernels.prepare_unpack(out, devs, 2.0)
    for step in range(2):
        out[...] = cp.arange(out.size, dtype=cp.float32) * (step + 1)
        unpack()
        hosts = [np.empty(d.shape, d.dtype) for d in devs]
        host.unpack(cp.asnumpy(out), hosts, 2.0)
        for d, h in zip(devs, hosts, strict=True):
            np.testing.assert_array_equal(cp.asnumpy(d), h)
    np.testing.assert_array_equal(cp.asnumpy(base[:, 1::2]), np.arange(24.0).reshape(4, 6)[:, 1::2])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "shape",
    [
        (5, 3, 7, 9),  # cols layout (s = 63)
        (4, 6),  # s = 1
        (2, 5, 3, 3, 3),
        (300, 17, 1),  # many rows: several row parts
        (3, 4, 20, 20),  # rows layout (s = 400)
        (2, 2, 37, 41),  # rows, odd
        (32, 64, 56, 56),  # ResNet-sized
        (0, 4, 2, 2),
    ],
)
def test_channel_sums_match_twin(dtype: Any, shape: tuple[int, ...]) -> None:
    cp = _cp()
    x = (np.random.default_rng(2).standard_normal(shape) + 0.25).astype(dtype)
    s_h, q_h = host.channel_sums(x)
    s_d, q_d = kernels.channel_sums(cp.asarray(x))
    assert s_d.dtype == s_h.dtype and q_d.dtype == q_h.dtype and s_d.shape == (shape[1],)
    n_per = max(1, x.size // max(1, shape[1]))
    tol = (
        {"rtol": 1e-4, "atol": 1e-5 * n_per}
        if s_h.dtype == np.float32
        else {"rtol": 1e-11, "atol": 1e-12 * n_per}
    )
    np.testing.assert_allclose(cp.asnumpy(s_d), s_h, **tol)
    np.testing.assert_allclose(cp.asnumpy(q_d), q_h, **tol)


def test_channel_sums_non_contiguous_and_f16_range() -> None:
    cp = _cp()
    x = cp.ones((70, 2, 1000), cp.float16)
    s, q = kernels.channel_sums(x)
    assert cp.asnumpy(s).tolist() == [70000.0, 70000.0] and cp.asnumpy(q).tolist() == [70000.0] * 2
    y = cp.asarray(np.random.default_rng(3).standard_normal((4, 6, 300)).astype(np.float32))[:, ::2]
    s_d, q_d = kernels.channel_sums(y)
    s_h, q_h = host.channel_sums(cp.asnumpy(y))
    np.testing.assert_allclose(cp.asnumpy(s_d), s_h, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(cp.asnumpy(q_d), q_h, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(5, 3, 7, 9), (4, 6), (3, 4, 20, 20), (0, 2, 3)])
def test_bn_backward_sums_match_twin(dtype: Any, shape: tuple[int, ...]) -> None:
    cp = _cp()
    rng = np.random.default_rng(4)
    gy = rng.standard_normal(shape).astype(dtype)
    xh = rng.standard_normal(shape).astype(dtype)
    a_h, b_h = host.bn_backward_sums(gy, xh)
    a_d, b_d = kernels.bn_backward_sums(cp.asarray(gy), cp.asarray(xh))
    tol = (
        {"rtol": 1e-4, "atol": 1e-3} if a_h.dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-11}
    )
    np.testing.assert_allclose(cp.asnumpy(a_d), a_h, **tol)
    np.testing.assert_allclose(cp.asnumpy(b_d), b_h, **tol)


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64, np.complex128])
@pytest.mark.parametrize(
    ("counts", "spatial"), [([2, 2, 1], (3, 5)), ([1, 3], (4, 4)), ([1, 0, 2], (3,)), ([2, 1], ())]
)
def test_gather_split_channels_match_twin(
    dtype: Any, counts: list[int], spatial: tuple[int, ...]
) -> None:
    cp = _cp()
    n = 3
    rng = np.random.default_rng(5)
    full = (rng.standard_normal((n, sum(counts), *spatial)) * 50).astype(dtype)
    flat = np.empty(full.size, dtype)
    host.split_channels(full, counts, flat)

    flat_d = kernels.split_channels(cp.asarray(full), counts)
    np.testing.assert_array_equal(cp.asnumpy(flat_d), flat)
    full_d = kernels.gather_channels(cp.asarray(flat), counts, n, spatial)
    np.testing.assert_array_equal(cp.asnumpy(full_d), full)

    # into a caller's buffers: a longer flat and a non-contiguous / other-dtype out
    longer = cp.zeros(flat.size + 4, dtype)
    kernels.split_channels(cp.asarray(full), counts, longer)
    np.testing.assert_array_equal(cp.asnumpy(longer[: flat.size]), flat)
    if np.dtype(dtype).kind == "f":
        out64 = cp.zeros(full.shape, np.float64)
        kernels.gather_channels(cp.asarray(flat), counts, n, spatial, out64)
        np.testing.assert_array_equal(cp.asnumpy(out64), full.astype(np.float64))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("factor", [1.0, 0.5, 1 / 3])
def test_scale_in_place_matches_twin(dtype: Any, factor: float) -> None:
    """kernels.scale (what a bucket reduced in the gradient's own memory gets instead of an
    aliased unpack) rounds as the numpy twin does, on a strided view too."""
    cp = _cp()
    rng = np.random.default_rng(1)
    host_x = rng.standard_normal((37, 6)).astype(dtype)
    want = host_x.copy()
    host.scale(want[:, ::2], factor)
    x = cp.asarray(host_x)
    kernels.scale(x[:, ::2], factor)
    np.testing.assert_array_equal(cp.asnumpy(x), want)


def test_prepared_pack_replayed_on_another_stream() -> None:
    """A prepared pack's tables are uploaded on the stream it was prepared on; replayed on
    another stream it waits on an event after the uploads (no host wait), and packs right."""
    cp = _cp()
    arrays = [cp.asarray(np.full(3000, 3.0, np.float32)), cp.asarray(np.full(5, 5.0, np.float16))]
    out = cp.zeros(3005, np.float32)
    cp.cuda.get_current_stream().synchronize()  # the data is there; the tables are not yet
    prepared = kernels.prepare_pack(arrays, out, 0.5)
    other = cp.cuda.Stream(non_blocking=True)
    with other:
        prepared()
    other.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), [1.5] * 3000 + [2.5] * 5)
