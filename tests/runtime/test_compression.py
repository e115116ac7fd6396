"""``inter_host_dtype``: shares cross hosts as float16 on ``two_dimensional`` (faked hosts).

The rank script checks exact agreement with the scheme's model on two hosts, identical bits
everywhere, and the warning where a communicator has nothing to narrow; here, the argument's
checks that need no ranks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mnify.runtime.communicators import compression
from tests.support.mpirun import run_ranks
from tests.support.rank_checks import missing

SCRIPT = Path(__file__).parent / "comm_scripts" / "inter_host_compression.py"
CHECKS = ["narrow-across-hosts", "float16-gradients-unchanged", "flat-warns-full-precision"]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [4, 6], ids=["2-hosts-of-2", "3-hosts-of-2"])
def test_float16_between_hosts(n: int) -> None:
    run = run_ranks(n, SCRIPT, timeout=240, env={"MNIFY_TEST_RANKS_PER_HOST": "2"})
    for r in range(n):
        not_passed = missing(run.rank_lines(r), CHECKS)
        assert not not_passed, f"rank {r} did not finish {not_passed}\n{run.describe()}"


def test_only_floating_dtypes_are_accepted() -> None:
    assert compression.inter_host_dtype(None) is None
    assert compression.inter_host_dtype("float16") == np.dtype(np.float16)
    with pytest.raises(ValueError, match="floating dtype"):
        compression.inter_host_dtype(np.int8)


def test_only_narrower_dtypes_compress() -> None:
    f16, f32, f64 = (np.dtype(t) for t in (np.float16, np.float32, np.float64))
    assert compression.narrower(f16, f32) == f16
    assert compression.narrower(f16, f64) == f16
    assert compression.narrower(f32, f64) == f32
    assert compression.narrower(f16, f16) is None  # a float16 wire has nothing to narrow
    assert compression.narrower(f32, f16) is None
    assert compression.narrower(None, f32) is None
    assert compression.narrower(f16, np.dtype(np.int32)) is None
