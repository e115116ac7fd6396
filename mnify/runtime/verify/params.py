"""A cheap exact digest of every parameter, and what makes a model model-parallel by design."""

from __future__ import annotations

import zlib
from typing import Any

import chainer
import numpy as np


def param_digests(target: chainer.Link, skip: frozenset[str] = frozenset()) -> dict[str, int]:
    """``{"/predictor/l1/W": crc}``: equal parameters hash equal on every rank (a CRC-32 of
    their bytes, read in place; 6x faster than BLAKE2 on CPU, and a false "equal" needs a
    2^-32 coincidence)."""
    out = {}
    for path, param in target.namedparams():
        if param.array is None or path in skip:
            continue
        array: Any = param.array  # numpy or CuPy; Any keeps mypy from narrowing to numpy's
        host = array if isinstance(array, np.ndarray) else array.get()
        out[path] = zlib.crc32(np.ascontiguousarray(host).data.cast("B"))
    return out


def channel_parallel_params(target: chainer.Link) -> frozenset[str]:
    """Paths of parameters that differ between ranks by design (a channel-parallel link holds
    its rank's share of the output channels)."""
    from mnify.runtime.links.parallel_convolution import ParallelConvolution2D

    out: set[str] = set()
    for path, link in target.namedlinks():
        if isinstance(link, ParallelConvolution2D):
            prefix = "" if path == "/" else path
            out.update(f"{prefix}{p}" for p, _ in link.namedparams())
    return frozenset(out)


def model_parallel_reasons(target: Any) -> list[str]:
    """Why ``target`` is a model-parallel model (empty for a data-parallel one)."""
    from mnify.runtime.links.multi_node_chain_list import MultiNodeChainList
    from mnify.runtime.links.parallel_convolution import ParallelConvolution2D

    reasons: list[str] = []
    if not isinstance(target, chainer.Link):
        return reasons
    for path, link in target.namedlinks():
        if isinstance(link, ParallelConvolution2D):
            reasons.append(f"channel-parallel link {path}")
            break
    for path, link in target.namedlinks():
        if isinstance(link, MultiNodeChainList):
            reasons.append(f"multi-node chain list {path}")
            break
    return reasons


def learning_rate(optimizer: Any) -> float | None:
    actual = getattr(optimizer, "actual_optimizer", optimizer)
    for name in ("lr", "alpha"):
        try:
            value = getattr(actual, name)
        except Exception:
            continue
        if isinstance(value, (int, float, np.floating)):
            return float(value)
    return None
