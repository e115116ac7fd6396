"""Rank script: gradients crossing hosts as float16 (``inter_host_dtype``) on faked or real hosts.

Every host runs the same number of ranks (``MNIFY_TEST_RANKS_PER_HOST``), so ``two_dimensional``
pairs rank i of each host in a column and rounds only what the column exchanges. Checks, for
float32 and float64 gradients, means and plain sums, twice in a row (slots reused):

- every rank of every host holds the same bits;
- two hosts of two ranks: the result is exactly the model of the scheme -- each host's sum of
  its two ranks (``a + b`` is exact in any order), rounded to float16, widened, added across
  hosts, then times 1/size -- so the share really crossed narrow and the scale came after;
- the result differs from the full-precision communicator's, and by no more than float16's
  rounding of the hosts' sums;
- float16 gradients (nothing narrower to cross in) get the full-precision result bit for bit;
- ``flat`` across hosts has no share stage: asked to compress, it warns and sends full precision.

Prints ``PASS <check>`` per check; a failing check raises.
"""

from __future__ import annotations

import warnings

import numpy as np
from mpi4py import MPI

from tests.support.rank_checks import GradientModel, fake_hosts

SHAPES = [(3, 5), (7,), (1000,), (64, 33), (300_000,), (17, 19)]


def grads_of(rank: int, dtype: type, salt: int) -> list[np.ndarray]:
    rng = np.random.RandomState(500 + 31 * rank + salt)
    # magnitudes spread over decades, as gradients are
    return [
        (rng.standard_normal(s) * 10.0 ** rng.uniform(-3, 1, size=s)).astype(dtype) for s in SHAPES
    ]


def same_bits(what: str, x: np.ndarray) -> None:
    digests = MPI.COMM_WORLD.allgather(np.ascontiguousarray(x).tobytes())
    if any(d != digests[0] for d in digests):
        raise AssertionError(f"{what}: ranks disagree bit for bit")


def scheme_model(every: list[list[np.ndarray]], per_host: int, scale: float) -> list[np.ndarray]:
    """Two hosts: f32(f16(host 0's sum)) + f32(f16(host 1's sum)), times ``scale``."""
    out = []
    for i in range(len(SHAPES)):
        dtype = every[0][i].dtype
        hosts = [
            sum(every[h * per_host + q][i] for q in range(1, per_host)) + every[h * per_host][i]
            for h in range(2)
        ]
        narrow = [x.astype(np.float16).astype(dtype) for x in hosts]
        total = narrow[0] + narrow[1]
        out.append(total * dtype.type(scale) if scale != 1.0 else total)
    return out


def main() -> None:
    fake_hosts()
    from mnify import runtime as mn

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    narrow = mn.create_communicator("two_dimensional", inter_host_dtype=np.float16)
    full = mn.create_communicator("two_dimensional")
    assert narrow.compresses_between_hosts, "two_dimensional did not take inter_host_dtype"
    assert not full.compresses_between_hosts
    per_host, hosts = narrow.intra_size, narrow.inter_size
    for dtype in (np.float32, np.float64):
        for salt in range(2):
            every = [grads_of(q, dtype, salt) for q in range(size)]
            for division, label in ((True, "mean"), (False, "sum")):
                got = grads_of(rank, dtype, salt)
                ref = grads_of(rank, dtype, salt)
                if division:
                    narrow.multi_node_mean_grad(GradientModel(got))
                    full.multi_node_mean_grad(GradientModel(ref))
                else:
                    narrow.all_reduce(got)
                    full.all_reduce(ref)
                what = f"{label} {np.dtype(dtype)} #{salt}"
                differs = False
                scale = 1.0 / size if division else 1.0
                for i, (g, r) in enumerate(zip(got, ref, strict=True)):
                    assert g.dtype == dtype, (what, i)
                    same_bits(f"{what} p{i}", g)
                    # float16 keeps 11 bits of each host's sum (and of partial sums, with more
                    # hosts): the error is bounded by the hosts' magnitudes, not the result's
                    magnitude = sum(
                        np.abs(
                            sum(
                                every[h * per_host + q][i].astype(np.float64)
                                for q in range(per_host)
                            )
                        )
                        for h in range(hosts)
                    )
                    bound = magnitude * scale * 2.0**-9 + 1e-12
                    excess = np.abs(g.astype(np.float64) - r) - bound
                    assert excess.max() <= 0, f"{what} p{i}: off by more than float16 rounding"
                    differs |= not np.array_equal(g, r)
                assert differs, f"{what}: nothing was rounded on the way across hosts"
                if hosts == 2:
                    model = scheme_model(every, per_host, 1.0 / size if division else 1.0)
                    for i, (g, m) in enumerate(zip(got, model, strict=True)):
                        np.testing.assert_array_equal(g, m, err_msg=f"{what} p{i} vs model")
    sub = narrow.split(0, rank)  # a split inherits the setting
    assert sub.inter_host_dtype == np.float16 and sub.compresses_between_hosts
    sub.finalize()
    print("PASS narrow-across-hosts", flush=True)

    got, ref = grads_of(rank, np.float16, 0), grads_of(rank, np.float16, 0)
    narrow.multi_node_mean_grad(GradientModel(got))
    full.multi_node_mean_grad(GradientModel(ref))
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_array_equal(g, r)
    print("PASS float16-gradients-unchanged", flush=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flat = mn.create_communicator("flat", inter_host_dtype=np.float16)
    assert any("inter_host_dtype" in str(w.message) for w in caught), caught
    got = grads_of(rank, np.float32, 1)
    every = [grads_of(q, np.float32, 1) for q in range(size)]
    flat.multi_node_mean_grad(GradientModel(got))
    for i, g in enumerate(got):
        wide = [e[i].astype(np.float64) for e in every]
        # full precision: float32 rounding of the sum of magnitudes, nothing like float16's
        bound = sum(np.abs(w) for w in wide) / size * 1e-6
        assert (np.abs(g - sum(wide) / size) <= bound).all(), f"flat p{i} was rounded"
    print("PASS flat-warns-full-precision", flush=True)
    for comm in (narrow, full, flat):
        comm.finalize()


if __name__ == "__main__":
    main()
