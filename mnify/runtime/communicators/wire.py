"""The wire format of the communicators: arrays as raw bytes with a (dtype, shape) header, and
the offsets of variable-sized pieces in one buffer. Plain numpy: what crosses MPI."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Header = tuple[str, tuple[int, ...]]


def offsets(counts: Sequence[int]) -> list[int]:
    """Where each of ``counts`` starts when they are laid end to end."""
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def as_bytes(x: np.ndarray) -> np.ndarray:
    """The raw bytes of ``x`` as a 1-D uint8 array (a view when ``x`` is contiguous)."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def header_of(x: np.ndarray) -> Header:
    """What a receiver needs to turn the bytes back into ``x``."""
    return (x.dtype.str, tuple(int(d) for d in x.shape))


def from_bytes(raw: np.ndarray, header: Header) -> np.ndarray:
    """The array ``header`` describes, viewing ``raw``."""
    dtype, shape = header
    return raw.view(np.dtype(dtype)).reshape(shape)
