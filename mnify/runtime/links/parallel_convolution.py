"""Channel-parallel 2-D convolution: each rank holds a slice of the output channels.

Every rank sees the same input batch (``create_multi_node_iterator``) and runs the same model, so
everything outside these layers is replicated. Inside, rank r keeps ``out_channels // size``
output channels (one more for the first ``out_channels % size`` ranks) of the weight and bias,
convolves the full input with its slice, and the slices are all-gathered so every rank continues
with the full output. The result, and every gradient, equals one plain ``Convolution2D`` whose
weight is the concatenation of the slices.

Backward follows from the replication (the loss is the same on every rank, not a sum over ranks):

* the output gradient is identical on every rank, so rank r just keeps its own channels of it
  (no communication);
* rank r's weight slice only contributes part of the input gradient, so the input gradient is
  all-reduced (summed) over ranks; when the input needs no gradient (the first layer) nothing is
  communicated.

This only holds while the replicas stay identical: same batches, same random draws (seed every
rank alike; dropout masks included), same ops. It is the layout Megatron-LM calls a column-parallel
layer.

This link is a plain ``chainer.Link``, not a ``Convolution2D`` subclass (whose own
``in_channels`` / ``out_channels`` would clash with the full layer's): there is no parent
attribute to overwrite. ``in_channels`` / ``out_channels`` are the full layer's;
the slice is ``local_out_channels`` channels starting at ``channel_offset``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import chainer
import chainer.functions as F
import numpy as np
from chainer import backend, initializers

from mnify.runtime import debug
from mnify.runtime.errors import CollectiveMismatch, format_ranks
from mnify.runtime.functions.collective_communication import (
    allreduce_sum,
    array_module,
    grad_or_zeros,
    like_module,
)

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


def channel_counts(channels: int, size: int) -> list[int]:
    """How many of ``channels`` each of ``size`` ranks owns: the first ``channels % size`` get one more."""
    return [channels // size + (1 if r < channels % size else 0) for r in range(size)]


def channel_offsets(counts: Sequence[int]) -> list[int]:
    """Where each rank's channels start in the full layer."""
    offsets, start = [], 0
    for c in counts:
        offsets.append(start)
        start += c
    return offsets


class SliceOfFull(chainer.Initializer):
    """Fill a rank's slice with exactly what ``inner`` would put there in the full array.

    The full array is generated (same shape, same random draws as a plain ``Convolution2D``)
    and only rows ``start : start + len(slice)`` are kept, so seeding every rank like the
    single-process script reproduces its initial weights. The full array lives only for the
    duration of the call.
    """

    def __init__(self, inner: Any, full_rows: int, start: int) -> None:
        super().__init__(dtype=getattr(inner, "dtype", None))
        self.inner = inner
        self.full_rows = full_rows
        self.start = start

    def __call__(self, array: Any) -> None:
        full = initializers.generate_array(
            self.inner,
            (self.full_rows, *array.shape[1:]),
            backend.get_array_module(array),
            dtype=array.dtype,
        )
        array[...] = full[self.start : self.start + array.shape[0]]


def fingerprint(x: Any) -> tuple[str, tuple[int, ...], float, float, float]:
    """dtype, shape, sum, sum of magnitudes and a position-weighted sum of ``x`` (float64).

    Cheap to compare across ranks; the weighted sum also tells apart reordered values.
    """
    array = chainer.as_array(x)
    xp = array_module(array)
    wide = array.astype(np.float64)
    weights = (xp.arange(wide.size, dtype=np.float64) % 7 + 1).reshape(wide.shape)
    return (
        array.dtype.str,
        tuple(int(d) for d in array.shape),
        float(wide.sum()),
        float(xp.abs(wide).sum()),
        float((wide * weights).sum()),
    )


def check_replicated(comm: CommunicatorBase, x: Any, what: str, rtol: float = 1e-5) -> None:
    """Raise on every rank unless ``x`` is the same on all of them (up to ``rtol``).

    Channel parallelism is exact only while the replicas agree (same batches, same seeds): a
    script that does not seed every rank alike initialises its replicated layers differently.
    This catches that at the first layer that sees it instead of training on quietly. The
    tolerance absorbs non-bitwise-reproducible GPU kernels; diverged replicas differ by far more.
    """
    prints = comm.allgather_obj(fingerprint(x))
    scale = max(abs(p[3]) for p in prints) * 7 + 1e-30
    ref = prints[0]

    def agrees(p: tuple[str, tuple[int, ...], float, float, float]) -> bool:
        same_kind = p[:2] == ref[:2]
        return same_kind and all(
            abs(a - b) <= rtol * scale for a, b in zip(p[2:], ref[2:], strict=True)
        )

    differing = [r for r, p in enumerate(prints) if not agrees(p)]
    if differing:
        raise CollectiveMismatch(
            f"{what} differs between ranks: rank(s) {format_ranks(differing)} disagree with "
            "rank 0. Channel-parallel layers need every rank to run the same model on the same "
            "batch: feed them with create_multi_node_iterator and seed the random number "
            "generators (numpy, and cupy on GPUs) alike on every rank"
        )


class _ReplicatedInput(chainer.FunctionNode):
    """Identity forward; backward sums the partial input gradients of all ranks."""

    def __init__(self, comm: CommunicatorBase) -> None:
        self.comm = comm

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        x = inputs[0]
        self.meta = (x.shape, x.dtype, array_module(x))
        return (x,)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        shape, dtype, xp = self.meta
        gx = grad_or_zeros(grad_outputs[0], shape, dtype, xp)
        return (chainer.Variable(allreduce_sum(self.comm, xp.ascontiguousarray(gx))),)


class _GatherChannels(chainer.FunctionNode):
    """All-gather the ranks' channel slices into the full output; backward keeps our slice."""

    def __init__(self, comm: CommunicatorBase, offset: int, count: int) -> None:
        self.comm = comm
        self.offset = offset
        self.count = count

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        y = inputs[0]
        xp = array_module(y)
        # The communicator hands back one array per rank, so one concatenate is the only copy.
        parts = [like_module(p, xp) for p in self.comm.allgather(xp.ascontiguousarray(y))]
        return (xp.concatenate(parts, axis=1),)

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable | None, ...]
    ) -> tuple[chainer.Variable | None, ...]:
        gy = grad_outputs[0]
        if gy is None:
            return (None,)
        xp = array_module(gy)
        g: Any = gy.array
        own = g[:, self.offset : self.offset + self.count]
        return (chainer.Variable(xp.ascontiguousarray(own)),)


class ParallelConvolution2D(chainer.Link):
    """``Convolution2D`` whose output channels are split over the ranks of ``comm``.

    Arguments are ``Convolution2D``'s, with the communicator first: ``in_channels`` and
    ``out_channels`` are the full layer's, and ``ParallelConvolution2D(comm, out, ksize)``
    (``ksize`` in the third place) leaves ``in_channels`` to be inferred at the first call.

    ``initialW`` / ``initial_bias`` may be initializers, scalars, or arrays of the *full* shapes
    ``(out_channels, in_channels, kh, kw)`` / ``(out_channels,)``: each rank keeps its slice.
    That, :meth:`load_full_weights` and :meth:`from_convolution` are the ways to load a
    pretrained (or test) ``Convolution2D``; :meth:`full_weights` gathers it back.
    """

    W: chainer.Parameter
    b: chainer.Parameter | None

    def __init__(
        self,
        comm: CommunicatorBase,
        in_channels: int | None,
        out_channels: int,
        ksize: int | tuple[int, int] | None = None,
        stride: int | tuple[int, int] = 1,
        pad: int | tuple[int, int] = 0,
        nobias: bool = False,
        initialW: Any = None,
        initial_bias: Any = None,
        *,
        dilate: int | tuple[int, int] = 1,
        groups: int = 1,
    ) -> None:
        super().__init__()
        if ksize is None:
            in_channels, out_channels, ksize = None, int(in_channels or 0), out_channels
        if groups != 1:
            raise NotImplementedError(
                "ParallelConvolution2D splits output channels; groups must be 1"
            )
        if out_channels < 1:
            raise ValueError(f"out_channels must be positive, got {out_channels}")
        self.comm = comm
        self.in_channels = in_channels
        self.out_channels = int(out_channels)
        self.ksize: int | tuple[int, int] = ksize
        self.stride = _pair(stride)
        self.pad = _pair(pad)
        self.dilate = _pair(dilate)
        self.channel_counts = channel_counts(self.out_channels, comm.size)
        self.channel_offset = channel_offsets(self.channel_counts)[comm.rank]
        self.local_out_channels = self.channel_counts[comm.rank]
        self.replication_checked = False
        # Saved with the parameters, so a snapshot of one rank's slice cannot be loaded into
        # another rank's (same shapes, wrong channels) without an error: see serialize().
        self.add_persistent("channel_slice", self._expected_slice())
        with self.init_scope():
            self.W = chainer.Parameter(
                SliceOfFull(
                    initializers._get_initializer(initialW), self.out_channels, self.channel_offset
                )
            )
            if in_channels is not None:
                self._initialize_params(in_channels)
            if nobias:
                self.b = None
            else:
                bias_value: Any = 0 if initial_bias is None else initial_bias
                bias_init = initializers._get_initializer(bias_value)
                self.b = chainer.Parameter(
                    SliceOfFull(bias_init, self.out_channels, self.channel_offset),
                    (self.local_out_channels,),
                )

    def _initialize_params(self, in_channels: int) -> None:
        kh, kw = _pair(self.ksize)
        self.in_channels = int(in_channels)
        self.W.initialize((self.local_out_channels, self.in_channels, kh, kw))

    def _expected_slice(self) -> np.ndarray:
        return np.array(
            [self.channel_offset, self.local_out_channels, self.out_channels], dtype=np.int64
        )

    def serialize(self, serializer: Any) -> None:
        """Save or load this rank's slice; loading another rank's (or world size's) fails.

        Each rank holds different channels, so model snapshots must be written by every rank
        (one file per rank), not by rank 0 alone.
        """
        expected = self._expected_slice()
        if isinstance(serializer, chainer.serializer.Deserializer):
            # Check before the parameters load: a wrong slice may have the same shapes.
            got = np.asarray(serializer("channel_slice", expected.copy())).astype(np.int64)
            if not np.array_equal(got, expected):
                raise ValueError(
                    f"rank {self.comm.rank}: the snapshot holds output channels "
                    f"{got[0]}..{got[0] + got[1] - 1} of {got[2]}, but this rank owns channels "
                    f"{expected[0]}..{expected[0] + expected[1] - 1} of {expected[2]}: load the "
                    "snapshot this rank wrote (model snapshots are per rank under channel "
                    "parallelism)"
                )
        super().serialize(serializer)

    @property
    def printable_specs(self) -> Any:
        yield from (
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("local_out_channels", self.local_out_channels),
            ("ksize", self.ksize),
            ("stride", self.stride),
            ("pad", self.pad),
            ("nobias", self.b is None),
            ("dilate", self.dilate),
        )

    def forward(self, x: Any) -> chainer.Variable:
        """The full convolution output (all ``out_channels``), identical on every rank."""
        if self.W.array is None:
            self._initialize_params(x.shape[1])
        if debug.enabled() or not self.replication_checked:
            # Every call under MNIFY_DEBUG=1, else the first: diverged replicas fail loudly.
            check_replicated(self.comm, x, "ParallelConvolution2D input")
            self.replication_checked = True
        if isinstance(x, chainer.Variable) and x.requires_grad:
            x = _ReplicatedInput(self.comm).apply((x,))[0]
        y_local = F.convolution_2d(x, self.W, self.b, self.stride, self.pad, dilate=self.dilate)
        gather = _GatherChannels(self.comm, self.channel_offset, self.local_out_channels)
        result: chainer.Variable = gather.apply((y_local,))[0]
        return result

    # -- moving whole layers in and out ----------------------------------------------------------

    def local_slice(self) -> slice:
        """This rank's rows of the full weight / bias."""
        return slice(self.channel_offset, self.channel_offset + self.local_out_channels)

    def load_full_weights(self, W: Any, b: Any = None) -> None:
        """Copy this rank's slice of a full ``(out, in, kh, kw)`` weight (and ``(out,)`` bias).

        No communication: every rank passes the same full arrays (e.g. from a pretrained
        ``Convolution2D`` loaded on every rank). Initialises a lazily shaped layer.
        """
        W = chainer.as_array(W)
        if W.shape[0] != self.out_channels:
            raise ValueError(
                f"full weight has {W.shape[0]} output channels, layer has {self.out_channels}"
            )
        if self.W.array is None:
            self._initialize_params(W.shape[1])
        if tuple(W.shape[1:]) != tuple(self.W.shape[1:]):
            raise ValueError(f"full weight shape {W.shape} does not fit local {self.W.shape}")
        local_W: Any = self.W.array
        xp = array_module(local_W)
        local_W[...] = like_module(W[self.local_slice()], xp)
        if b is not None:
            if self.b is None:
                raise ValueError("this layer has no bias (nobias=True) but a bias was given")
            local_b: Any = self.b.array
            local_b[...] = like_module(chainer.as_array(b)[self.local_slice()], xp)

    def full_weights(self) -> tuple[Any, Any]:
        """The full weight and bias (None without bias), gathered from every rank (collective)."""
        W = self.W.array
        if W is None:
            raise RuntimeError("the weight is not initialised yet (in_channels unknown)")
        xp = array_module(W)
        full_W = xp.concatenate([like_module(p, xp) for p in self.comm.allgather(W)], axis=0)
        full_b = None
        if self.b is not None:
            full_b = xp.concatenate(
                [like_module(p, xp) for p in self.comm.allgather(self.b.array)], axis=0
            )
        return full_W, full_b

    @classmethod
    def from_convolution(
        cls, comm: CommunicatorBase, conv: chainer.links.Convolution2D
    ) -> ParallelConvolution2D:
        """A channel-parallel copy of a plain ``Convolution2D`` (same weights, every rank its slice)."""
        if conv.groups != 1:
            raise NotImplementedError("grouped convolutions cannot be split by output channel")
        if conv.W.array is None:
            raise ValueError(
                "the Convolution2D is not initialised yet: run it once or give in_channels"
            )
        layer = cls(
            comm,
            conv.W.shape[1],
            conv.out_channels,
            conv.ksize,
            conv.stride,
            conv.pad,
            nobias=conv.b is None,
            dilate=conv.dilate,
        )
        layer.load_full_weights(conv.W.array, None if conv.b is None else conv.b.array)
        return layer


def _pair(x: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(x, Sequence):
        a, b = x
        return int(a), int(b)
    return int(x), int(x)


__all__ = ["ParallelConvolution2D", "SliceOfFull", "channel_counts", "channel_offsets"]
