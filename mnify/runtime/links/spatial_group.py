"""The spatial group of a spatially parallel model, and how it knows which tensors are slabs.

A slab is recognised on the computational graph: every slab-producing op ends in a
:class:`~mnify.runtime.functions.slab_functions.SlabMark` carrying its layout, and a variable
made from slabs by *row-local* functions (elementwise activations and arithmetic, casts,
concatenation along channels, ...) has the layout of those slabs. Any other Chainer function
applied to a slab would mix rows that live on different ranks, so :func:`layout_of` raises
:class:`SpatialSplitError` naming the function and the layer that called it. This is why the
model's call always records a graph (``enable_backprop`` is forced on inside it, and the
outputs are cut from it again when the caller asked for no backprop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import chainer
from chainer.functions.activation import (
    clipped_relu,
    elu,
    leaky_relu,
    relu,
    sigmoid,
    softplus,
    tanh,
)
from chainer.functions.array import broadcast, cast, concat, copy, get_item
from chainer.functions.math import basic_math, exponential, identity, maximum, minimum, sqrt, square
from chainer.functions.normalization import batch_normalization, local_response_normalization

from mnify.runtime.functions.halo_exchange import SlabLayout
from mnify.runtime.functions.slab_functions import GatherSlabs, ReplicatedSum, SlabMark

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


class SpatialSplitError(ValueError):
    """A layer or function of the model cannot run on slabs of rows."""


# Function nodes whose output row i depends only on input row i (same layout in, same out).
ROW_LOCAL: tuple[type, ...] = (
    relu.ReLU,
    leaky_relu.LeakyReLU,
    sigmoid.Sigmoid,
    tanh.Tanh,
    elu.ELU,
    clipped_relu.ClippedReLU,
    softplus.Softplus,
    basic_math.Add,
    basic_math.AddConstant,
    basic_math.Sub,
    basic_math.SubFromConstant,
    basic_math.Mul,
    basic_math.MulConstant,
    basic_math.Div,
    basic_math.DivFromConstant,
    basic_math.Neg,
    basic_math.Absolute,
    basic_math.PowVarConst,
    basic_math.PowConstVar,
    basic_math.PowVarVar,
    exponential.Exp,
    exponential.Log,
    sqrt.Sqrt,
    square.Square,
    maximum.Maximum,
    minimum.Minimum,
    identity.Identity,
    cast.Cast,
    copy.Copy,
    broadcast.BroadcastTo,
    broadcast.Broadcast,
    batch_normalization.FixedBatchNormalization,
    local_response_normalization.LocalResponseNormalization,
)

_active: list[SpatialGroup] = []


class SpatialGroup:
    """The ranks that split one model's activations, the slab axis, and per-call state."""

    def __init__(
        self,
        comm: CommunicatorBase,
        axis: int,
        batch_norm_comm: CommunicatorBase,
        overlap: bool = True,
    ) -> None:
        self.comm = comm
        self.overlap = overlap
        self.axis = axis
        self.batch_norm_comm = batch_norm_comm
        self._layouts: dict[int, SlabLayout | None] = {}
        self.layer_stack: list[str] = []
        self.layer_names: dict[int, str] = {}

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    @contextlib.contextmanager
    def calling(self, model: chainer.Link) -> Iterator[None]:
        """Active for the duration of the model's call: slab tracking, layer names."""
        self._layouts = {}
        self.layer_names = {id(link): path or "/" for path, link in model.namedlinks()}
        self.layer_stack = []
        _active.append(self)
        try:
            with _LayerTracker(self), _FunctionTagger(self):
                yield
        finally:
            _active.pop()
            self._layouts = {}

    def layout_of(self, x: Any) -> SlabLayout | None:
        """The slab layout of ``x``, or None when ``x`` is the same on every rank."""
        if not isinstance(x, chainer.Variable):
            return None
        return self._node_layout(x.node)

    def _node_layout(self, node: Any) -> SlabLayout | None:
        key = id(node)
        if key in self._layouts:
            return self._layouts[key]
        creator = node.creator_node
        layout: SlabLayout | None
        if creator is None or isinstance(creator, (GatherSlabs, ReplicatedSum)):
            layout = None
        elif isinstance(creator, SlabMark):
            layout = creator.layout
        else:
            found = [lay for lay in (self._node_layout(i) for i in creator.inputs) if lay]
            layout = found[0] if found else None
            if layout is not None:
                self._check_row_local(creator, node, found)
        self._layouts[key] = layout
        return layout

    def _check_row_local(self, creator: Any, node: Any, found: list[SlabLayout]) -> None:
        layout = found[0]
        where = getattr(creator, "mnify_layer", None) or "the model's forward"
        name = creator.label if hasattr(creator, "label") else type(creator).__name__
        problem = None
        if any(other != layout for other in found[1:]):
            problem = "combines tensors split into different slabs"
        elif isinstance(creator, concat.Concat):
            if creator.axis % len(node.shape) == layout.axis:
                problem = "concatenates along the slab axis"
        elif isinstance(creator, get_item.GetItem):
            slices = creator.slices if isinstance(creator.slices, tuple) else (creator.slices,)
            before = slices[: layout.axis + 1]
            if any(s is Ellipsis or s is None for s in before) or (
                len(slices) > layout.axis and slices[layout.axis] != slice(None)
            ):
                problem = "indexes along (or before) the slab axis"
        elif not isinstance(creator, ROW_LOCAL):
            problem = "mixes rows that live on different ranks"
        if problem is None and (
            len(node.shape) <= layout.axis or node.shape[layout.axis] != layout.rows(self.rank)
        ):
            problem = f"changes the slab's row count (output shape {node.shape})"
        if problem is not None:
            raise SpatialSplitError(
                f"{name}, called in layer {where}, {problem}: it cannot run on the slabs of a "
                "spatially parallel model. Use the links and functions that split "
                "(L.Convolution2D, L.BatchNormalization, F.max_pooling_2d, "
                "F.average_pooling_2d, F.average/F.mean/F.sum over the spatial axes, "
                "elementwise functions), or apply it after a global pooling"
            )


def active_group() -> SpatialGroup | None:
    """The spatial group whose model is being called now, if any."""
    return _active[-1] if _active else None


class _LayerTracker(chainer.LinkHook):
    """Keeps the path of the link being called, to name it in errors."""

    name = "mnify_spatial_layers"

    def __init__(self, group: SpatialGroup) -> None:
        self.group = group

    def forward_preprocess(self, args: Any) -> None:
        link = args.link
        self.group.layer_stack.append(self.group.layer_names.get(id(link), type(link).__name__))

    def forward_postprocess(self, args: Any) -> None:
        self.group.layer_stack.pop()


class _FunctionTagger(chainer.FunctionHook):
    """Tags each function node with the layer that applied it."""

    name = "mnify_spatial_functions"

    def __init__(self, group: SpatialGroup) -> None:
        self.group = group

    def forward_preprocess(self, function: Any, in_data: Any) -> None:
        stack = self.group.layer_stack
        function.mnify_layer = stack[-1] if stack else None


__all__ = ["ROW_LOCAL", "SpatialGroup", "SpatialSplitError", "active_group"]
