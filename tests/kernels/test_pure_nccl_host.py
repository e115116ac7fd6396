"""The parts of ``pure_nccl`` that need no GPU: availability report, errors, device choice,
the NCCL unique id in CuPy 13's and 14's forms, the bucket planner it shares with the host.

Kept out of tests/gpu: tests/conftest.py skips every test whose keywords include "gpu", and a
directory name counts as a keyword.
"""

from __future__ import annotations

from typing import Any

import pytest

from mnify.runtime.communicators.buckets import plan_buckets
from mnify.runtime.communicators.pure_nccl import (
    can_average,
    choose_device,
    cupy_major,
    format_nccl_version,
    join_nccl,
    nccl_status,
    unique_id_bytes,
)
from tests.support.mpirun import run_ranks


def _has_cupy() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]  # noqa: F401
    except Exception:
        return False
    return True


def test_nccl_status_never_raises_and_explains() -> None:
    ok, why = nccl_status()
    assert isinstance(ok, bool) and why
    if not _has_cupy():
        assert not ok and "CuPy" in why


@pytest.mark.skipif(_has_cupy(), reason="CuPy is installed: the missing-CuPy error cannot happen")
def test_constructing_without_cupy_says_what_is_missing() -> None:
    script = """
from mnify.runtime.communicators import create_communicator
from mnify.runtime.communicators.pure_nccl import PureNcclCommunicator
for make in (lambda: create_communicator("pure_nccl"), PureNcclCommunicator):
    try:
        make()
    except RuntimeError as exc:
        print("ERROR", exc)
    else:
        print("NO ERROR")
"""
    run = run_ranks(2, script, timeout=120)
    for r in range(2):
        lines = run.rank_lines(r)
        assert len(lines) == 2, run.output
        for line in lines:
            assert line.startswith("ERROR the pure_nccl communicator cannot run here: CuPy")
            assert "'flat'" in line


def test_format_nccl_version() -> None:
    assert format_nccl_version(22304) == "2.23.4"
    assert format_nccl_version(2708) == "2.7.8"
    assert format_nccl_version(0) == "unknown"


def test_one_bucket_by_default_on_the_device() -> None:
    assert plan_buckets([3, 0, 5], None) == [[(0, 0, 3), (2, 0, 5)]]
    assert plan_buckets([], None) == []
    assert plan_buckets([0, 0], 4) == []


def test_device_choice_follows_what_the_process_sees() -> None:
    # every rank sees the host's 4 GPUs: one each
    assert [choose_device(r, 4) for r in range(4)] == [0, 1, 2, 3]
    # CUDA_VISIBLE_DEVICES isolation: each rank sees only its own GPU, as device 0
    assert [choose_device(r, 1) for r in range(4)] == [0, 0, 0, 0]
    # groups of two per rank pair ("0,1" for ranks 0-1, "2,3" for ranks 2-3)
    assert [choose_device(r, 2) for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(RuntimeError, match="no CUDA device"):
        choose_device(0, 0)


def test_unique_id_bytes_from_either_cupy() -> None:
    raw = bytes(range(128))[::-1]
    assert unique_id_bytes(raw) == raw
    signed = tuple(b - 256 if b > 127 else b for b in raw)  # CuPy 13 on x86-64
    assert unique_id_bytes(signed) == raw
    assert unique_id_bytes(tuple(raw)) == raw  # CuPy 13 where char is unsigned
    with pytest.raises(ValueError, match="128 bytes"):
        unique_id_bytes(b"short")


class _Binding:
    """NcclCommunicator's argument checks as Cython applies them, per CuPy version and char."""

    def __init__(self, major: int, char_signed: bool = True) -> None:
        self.major, self.char_signed = major, char_signed
        self.got: list[Any] = []
        binding = self

        class NcclCommunicator:
            def __init__(self, ndev: int, comm_id: Any, rank: int) -> None:
                wanted = bytes if binding.major >= 14 else tuple
                if not isinstance(comm_id, wanted):
                    raise TypeError(f"expected {wanted.__name__}, got {type(comm_id).__name__}")
                if wanted is tuple:
                    lo, hi = (-128, 127) if binding.char_signed else (0, 255)
                    if not all(lo <= c <= hi for c in comm_id):
                        raise OverflowError("value out of range for char")
                binding.got.append(comm_id)

        self.NcclCommunicator = NcclCommunicator


@pytest.mark.parametrize(
    ("version", "char_signed", "form"),
    [("14.2.0", True, bytes), ("14.0.0rc1", True, bytes), ("13.6.0", True, "signed")]
    + [("13.6.0", False, "unsigned")],
)
def test_join_nccl_passes_the_id_as_this_cupy_takes_it(
    version: str, char_signed: bool, form: Any
) -> None:
    uid = bytes(range(256))[::2]  # values on both sides of 127
    binding = _Binding(cupy_major(version), char_signed)
    join_nccl(binding, version, 2, uid, 0)
    got = binding.got[-1]
    if form is bytes:
        assert got == uid
    elif form == "signed":
        assert isinstance(got, tuple) and min(got) < 0 and unique_id_bytes(got) == uid
    else:
        assert got == tuple(uid)


def test_cupy_major() -> None:
    assert cupy_major("14.2.0") == 14 and cupy_major("13.6.0") == 13
    assert cupy_major("15.0.0a1") == 15 and cupy_major("weird") == 0


def test_can_average_needs_the_constant_and_nccl_2_10() -> None:
    class Nccl:
        NCCL_AVG = 4

        def __init__(self, version: int) -> None:
            self.get_version = lambda: version

    assert can_average(Nccl(21000)) and can_average(Nccl(22304))
    assert not can_average(Nccl(20903)) and not can_average(Nccl(2708))

    class Old:
        get_version = staticmethod(lambda: 22304)

    assert not can_average(Old())
