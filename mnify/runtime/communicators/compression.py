"""Shares crossing hosts in a narrower float (Horovod's fp16 compression): an opt-in.

Across hosts the link, not memory, bounds a mean: ResNet-50's 102 MB take at least 0.82 s
over 1 Gbit/s between two hosts. ``create_communicator('two_dimensional',
inter_host_dtype=np.float16)`` halves those bytes. Only the crossing is narrow: inside a host
the ranks reduce-scatter and all-gather in the gradients' own dtype, each host's sum of a share
is rounded to float16 just before it leaves and widened again on arrival, and the 1/size of the
mean is applied after the crossing, in the wide dtype (a gradient divided by the rank count
underflows float16 sooner than the gradient).

Two hosts swap their rounded shares and add them widened (``a + b == b + a``: both hosts get
the same bits); more hosts all-reduce the rounded shares in float16 where this MPI sums
float16 (Open MPI 5), as Horovod does, and send full precision where it cannot. Every rank of
every host still ends with the same bits.

Caveat, as with any float16 gradient: 11 significant bits, magnitudes below ~6e-8 become zero
and above 65504 infinite. Scripts that train without loss scaling and have tiny gradients
should keep full precision. Only ``two_dimensional`` has a share stage to narrow; other
communicators that span hosts warn once and send full precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def inter_host_dtype(value: Any) -> np.dtype[Any] | None:
    """``value`` checked: None, or a floating dtype (float16 is the useful one)."""
    if value is None:
        return None
    dtype = np.dtype(value)
    if dtype.kind != "f":
        raise ValueError(f"inter_host_dtype must be a floating dtype such as float16, got {dtype}")
    return dtype


def narrower(inter: np.dtype[Any] | None, wire: np.dtype[Any]) -> np.dtype[Any] | None:
    """The dtype a share of a ``wire`` bucket crosses hosts in; None when that is ``wire``
    itself (no compression asked, or ``inter`` is not narrower than ``wire``)."""
    if inter is None or wire.kind != "f" or inter.itemsize >= wire.itemsize:
        return None
    return inter
