"""Collectives as differentiable Chainer functions (ChainerMN's ``chainermn.functions`` API).

Every rank builds the same graph and calls the same functions in the same order (SPMD). The
gradient of rank r's inputs is taken with respect to the *sum of every rank's loss*, so each
backward is the adjoint collective of its forward: allgather <-> reduce-scatter (alltoall + sum),
alltoall <-> alltoall, bcast <-> sum at the root, gather <-> scatter, scatter <-> gather,
allreduce(sum) <-> allreduce(sum).

Two things keep backward from hanging where one rank would skip a collective the others enter:

* each node gets an extra zero-size *anchor* input that always requires grad, so Chainer never
  prunes the node's backward on a rank whose real inputs happen to need no gradient (a non-root
  rank of ``bcast`` has no real input at all);
* a missing output gradient (an output this rank did not use) is replaced by zeros of the
  output's shape, so the rank still takes part in the backward collective.

Data keeps its dtype in transit (the communicator carries shape and dtype); float16 gradients are
summed in float32 and cast back, so half precision loses nothing extra in reductions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np
from chainer import backend

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

Array = Any
VariableLike = Any  # chainer.Variable or an ndarray


# --------------------------------------------------------------------------- array helpers


def array_module(*arrays: Any) -> Any:
    """numpy or cupy, from the first array (or Variable) given that is not None."""
    present = [a.array if isinstance(a, chainer.Variable) else a for a in arrays if a is not None]
    return backend.get_array_module(*present) if present else np


def like_module(x: Array, xp: Any) -> Array:
    """``x`` moved into ``xp`` (numpy or cupy) when a transport returned the other kind."""
    if backend.get_array_module(x) is xp:
        return x
    if xp is np:
        return backend.CpuDevice().send(x)
    return xp.asarray(x)


def reduce_dtype(dtype: Any) -> Any:
    """The dtype a sum is carried out in: float32 for float16, else the dtype itself."""
    return np.float32 if np.dtype(dtype) == np.float16 else dtype


def allreduce_sum(comm: CommunicatorBase, x: Array) -> Array:
    """Sum of ``x`` over ranks, computed in :func:`reduce_dtype` and returned as ``x.dtype``."""
    xp = array_module(x)
    wide = reduce_dtype(x.dtype)
    y = comm.allreduce(xp.ascontiguousarray(x, dtype=wide), op="sum")
    return like_module(y, xp).astype(x.dtype, copy=False)


def make_anchor(xp: Any) -> chainer.Variable:
    """A zero-size variable that requires grad: keeps a communicating node's backward alive."""
    anchor = chainer.Variable(xp.empty((0,), dtype=np.float32), requires_grad=True)
    anchor.name = "anchor"
    return anchor


def grad_or_zeros(
    gy: chainer.Variable | None, shape: tuple[int, ...], dtype: Any, xp: Any
) -> Array:
    """The gradient array, or zeros when this rank did not use the output."""
    if gy is None:
        return xp.zeros(shape, dtype=dtype)
    return gy.array


def _as_variable(x: VariableLike) -> chainer.Variable:
    return x if isinstance(x, chainer.Variable) else chainer.Variable(x, requires_grad=False)


def _sum_arrays(arrays: Sequence[Array], dtype: Any) -> Array:
    total = arrays[0].astype(reduce_dtype(dtype), copy=True)
    for a in arrays[1:]:
        total += a
    return total.astype(dtype, copy=False)


# --------------------------------------------------------------------------- function nodes


class _Collective(chainer.FunctionNode):
    """Base: holds the communicator and remembers the outputs' shapes and dtypes."""

    def __init__(self, comm: CommunicatorBase) -> None:
        self.comm = comm
        self.out_meta: list[tuple[tuple[int, ...], Any]] = []
        self.in_meta: list[tuple[tuple[int, ...], Any]] = []
        self.xp: Any = np

    def _remember(self, inputs: Sequence[Array], outputs: Sequence[Array]) -> None:
        self.in_meta = [(tuple(a.shape), a.dtype) for a in inputs]
        self.out_meta = [(tuple(a.shape), a.dtype) for a in outputs]

    def _grads(self, grad_outputs: Sequence[chainer.Variable | None]) -> list[Array]:
        return [
            grad_or_zeros(g, shape, dtype, self.xp)
            for g, (shape, dtype) in zip(grad_outputs, self.out_meta, strict=True)
        ]


class AllGather(_Collective):
    """Every rank gets every rank's ``x`` (shapes may differ); backward is a reduce-scatter."""

    def forward(self, inputs: tuple[Array, ...]) -> tuple[Array, ...]:
        x = inputs[0]
        self.xp = array_module(x)
        ys = self.comm.allgather(x)
        outs = tuple(like_module(y, self.xp) for y in ys)
        self._remember(inputs[:1], outs)
        return outs

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        shape, dtype = self.in_meta[0]
        gys = [self.xp.ascontiguousarray(g) for g in self._grads(grad_outputs)]
        parts = self.comm.alltoall(gys)
        gx = _sum_arrays([like_module(p, self.xp) for p in parts], dtype)
        return chainer.Variable(gx.reshape(shape)), None


class AllToAll(_Collective):
    """Rank r sends ``xs[k]`` to rank k and gets ``ys[k]`` from it; backward is an alltoall too."""

    def forward(self, inputs: tuple[Array, ...]) -> tuple[Array, ...]:
        xs = inputs[:-1]
        self.xp = array_module(*xs)
        ys = self.comm.alltoall([self.xp.ascontiguousarray(x) for x in xs])
        outs = tuple(like_module(y, self.xp) for y in ys)
        self._remember(xs, outs)
        return outs

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        gys = [self.xp.ascontiguousarray(g) for g in self._grads(grad_outputs)]
        parts = self.comm.alltoall(gys)
        gxs = [
            chainer.Variable(like_module(p, self.xp).reshape(shape))
            for p, (shape, _) in zip(parts, self.in_meta, strict=True)
        ]
        return (*gxs, None)


class Bcast(_Collective):
    """The root's ``x`` on every rank; backward sums every rank's gradient into the root's."""

    def __init__(self, comm: CommunicatorBase, root: int, xp: Any) -> None:
        super().__init__(comm)
        self.root = root
        self.wanted_xp = xp  # None: keep whatever array module the communicator returns

    def forward(self, inputs: tuple[Array, ...]) -> tuple[Array, ...]:
        is_root = self.comm.rank == self.root
        x = inputs[0] if is_root else None
        self.xp = self.wanted_xp or (array_module(x) if x is not None else None)
        y = self.comm.bcast(self.xp.ascontiguousarray(x) if x is not None else None, self.root)
        self.xp = self.xp or array_module(y)
        out = like_module(y, self.xp)
        self._remember(inputs[:1] if is_root else (), (out,))
        return (out,)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        gx = allreduce_sum(self.comm, self._grads(grad_outputs)[0])
        if self.comm.rank == self.root:
            return chainer.Variable(gx), None
        return (None,)


class Gather(_Collective):
    """The root gets every rank's ``x``; others get an empty delegate; backward scatters."""

    def __init__(self, comm: CommunicatorBase, root: int) -> None:
        super().__init__(comm)
        self.root = root

    def forward(self, inputs: tuple[Array, ...]) -> tuple[Array, ...]:
        x = inputs[0]
        self.xp = array_module(x)
        ys = self.comm.gather(self.xp.ascontiguousarray(x), self.root)
        if self.comm.rank == self.root:
            assert ys is not None
            outs: tuple[Array, ...] = tuple(like_module(y, self.xp) for y in ys)
        else:
            outs = (self.xp.empty((0,), dtype=x.dtype),)
        self._remember(inputs[:1], outs)
        return outs

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        shape, dtype = self.in_meta[0]
        if self.comm.rank == self.root:
            parts = [self.xp.ascontiguousarray(g) for g in self._grads(grad_outputs)]
            got = self.comm.scatter(parts, self.root)
        else:
            got = self.comm.scatter(None, self.root)
        gx = like_module(got, self.xp).reshape(shape)
        return chainer.Variable(gx), None


class Scatter(_Collective):
    """Rank k gets the root's ``xs[k]``; backward gathers the gradients back to the root."""

    def __init__(self, comm: CommunicatorBase, root: int, xp: Any) -> None:
        super().__init__(comm)
        self.root = root
        self.wanted_xp = xp  # None: keep whatever array module the communicator returns

    def forward(self, inputs: tuple[Array, ...]) -> tuple[Array, ...]:
        is_root = self.comm.rank == self.root
        xs = inputs[:-1]
        if is_root:
            self.xp = self.wanted_xp or array_module(*xs)
            y = self.comm.scatter([self.xp.ascontiguousarray(x) for x in xs], self.root)
        else:
            y = self.comm.scatter(None, self.root)
            self.xp = self.wanted_xp or array_module(y)
        out = like_module(y, self.xp)
        self._remember(xs, (out,))
        return (out,)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        gy = self.xp.ascontiguousarray(self._grads(grad_outputs)[0])
        parts = self.comm.gather(gy, self.root)
        if self.comm.rank != self.root:
            return (None,)
        assert parts is not None
        gxs = [
            chainer.Variable(like_module(p, self.xp).reshape(shape))
            for p, (shape, _) in zip(parts, self.in_meta, strict=True)
        ]
        return (*gxs, None)


class AllReduce(_Collective):
    """Sum (or mean) of ``x`` over ranks; backward is the same reduction of the gradients."""

    def __init__(self, comm: CommunicatorBase, op: str) -> None:
        super().__init__(comm)
        if op not in ("sum", "mean"):
            raise ValueError(
                f"allreduce: op must be 'sum' or 'mean' to be differentiable, got {op!r}"
            )
        self.op = op

    def _reduce(self, x: Array) -> Array:
        total = allreduce_sum(self.comm, x)
        if self.op == "mean":
            total = (total.astype(reduce_dtype(x.dtype)) / self.comm.size).astype(x.dtype)
        return total

    def forward(self, inputs: tuple[Array, ...]) -> tuple[Array, ...]:
        x = inputs[0]
        self.xp = array_module(x)
        out = self._reduce(x)
        self._remember(inputs[:1], (out,))
        return (out,)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        return chainer.Variable(self._reduce(self._grads(grad_outputs)[0])), None


# --------------------------------------------------------------------------- public API


def allgather(comm: CommunicatorBase, x: VariableLike) -> tuple[chainer.Variable, ...]:
    """Differentiable all-gather: ``size`` variables, rank k's ``x`` at index k.

    Shapes may differ between ranks. Backward: rank r's ``x`` gets the sum over ranks of the
    gradients of output r (a reduce-scatter).
    """
    x = _as_variable(x)
    result: tuple[chainer.Variable, ...] = AllGather(comm).apply((x, make_anchor(array_module(x))))
    return result


def alltoall(comm: CommunicatorBase, xs: Sequence[VariableLike]) -> tuple[chainer.Variable, ...]:
    """Differentiable all-to-all: ``xs[k]`` goes to rank k; output k came from rank k."""
    if len(xs) != comm.size:
        raise ValueError(f"alltoall: need one input per rank ({comm.size}), got {len(xs)}")
    variables = [_as_variable(x) for x in xs]
    anchor = make_anchor(array_module(*variables))
    result: tuple[chainer.Variable, ...] = AllToAll(comm).apply((*variables, anchor))
    return result


def bcast(comm: CommunicatorBase, x: VariableLike | None, root: int = 0) -> chainer.Variable:
    """Differentiable broadcast of the root's ``x``.

    Non-root ranks may pass None (or any array: only its array module is used, so a GPU rank gets
    a CuPy result). Backward: the root's ``x`` gets the sum of every rank's output gradient.
    """
    xp = array_module(x) if x is not None else None
    anchor = make_anchor(xp or np)
    node = Bcast(comm, root, xp)
    if comm.rank == root:
        if x is None:
            raise ValueError(f"bcast: the root (rank {root}) must pass an array")
        return node.apply((_as_variable(x), anchor))[0]
    return node.apply((anchor,))[0]


def gather(
    comm: CommunicatorBase, x: VariableLike, root: int = 0
) -> tuple[chainer.Variable, ...] | chainer.Variable:
    """Differentiable gather: the root gets a tuple with every rank's ``x``.

    Other ranks get a zero-size *delegate* variable: it carries no data, only the graph, so
    its backward (directly, or through :func:`~mnify.runtime.functions.pseudo_connect`) lets the
    rank take part in the scatter that brings its gradient back.
    """
    x = _as_variable(x)
    outs = Gather(comm, root).apply((x, make_anchor(array_module(x))))
    if comm.rank == root:
        return tuple(outs)
    delegate: chainer.Variable = outs[0]
    delegate.name = "delegate_variable"
    return delegate


def scatter(
    comm: CommunicatorBase, xs: Sequence[VariableLike] | None, root: int = 0, *, xp: Any = None
) -> chainer.Variable:
    """Differentiable scatter: rank k gets the root's ``xs[k]`` (shapes may differ).

    Non-roots pass None; ``xp`` (numpy or cupy) picks where their result lives (default: the
    communicator's choice). Backward gathers the gradients back into the root's ``xs``.
    """
    if comm.rank == root:
        if xs is None or len(xs) != comm.size:
            raise ValueError(f"scatter: the root must pass one array per rank ({comm.size})")
        variables = [_as_variable(x) for x in xs]
        module = array_module(*variables)
        return Scatter(comm, root, module).apply((*variables, make_anchor(module)))[0]
    return Scatter(comm, root, xp).apply((make_anchor(xp or np),))[0]


def allreduce(comm: CommunicatorBase, x: VariableLike, op: str = "sum") -> chainer.Variable:
    """Differentiable all-reduce with ``op`` 'sum' or 'mean'; backward reduces the gradients."""
    x = _as_variable(x)
    result: chainer.Variable = AllReduce(comm, op).apply((x, make_anchor(array_module(x))))[0]
    return result
