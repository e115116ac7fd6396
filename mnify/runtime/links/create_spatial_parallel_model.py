"""create_spatial_parallel_model: a copy of a model that splits every image into slabs of rows.

Spatial parallelism (docs/model_parallel.md): every rank of ``comm`` holds all parameters and
one slab of rows of every activation; convolutions and pooling exchange only the halo rows their
windows read across slab boundaries, batch normalization and global reductions all-reduce small
per-channel sums. The model is called with the whole input on every rank (feed it with
``create_multi_node_iterator``) and returns the one-process output on every rank; after
``backward()`` every rank holds the one-process gradients, so a plain optimizer works (for
spatial x data layouts, give the multi-node optimizer the data-parallel communicator).

The user's ``forward`` is not edited. In a deep copy of the model, plain ``L.Convolution2D`` and
``L.BatchNormalization`` links become their slab-aware subclasses in place (parameter names and
snapshots unchanged), and while the model runs, ``F.max_pooling_2d``, ``F.average_pooling_2d``,
``F.sum``, ``F.average`` and ``F.mean`` are routed to slab-aware versions
(:mod:`mnify.runtime.functions.spatial_pooling`). Links that cannot be split are refused here;
a function that mixes rows is refused at the first call that applies it to a slab, naming it and
its layer (:class:`~mnify.runtime.links.spatial_group.SpatialSplitError`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify.runtime.functions import spatial_pooling
from mnify.runtime.functions.halo_exchange import SlabLayout
from mnify.runtime.functions.slab_functions import InputSlab, gather_slabs
from mnify.runtime.links.spatial_group import SpatialGroup, SpatialSplitError, active_group
from mnify.runtime.links.spatial_layers import SpatialBatchNormalization, SpatialConvolution2D

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

AXES = {"h": 2, "w": 3}

_SPLIT = {L.Convolution2D: SpatialConvolution2D, L.BatchNormalization: SpatialBatchNormalization}


def _unsplittable() -> tuple[type, ...]:
    """Links with windows or statistics over the image that have no slab-aware version."""
    from mnify.runtime.links.batch_normalization import MultiNodeBatchNormalization
    from mnify.runtime.links.parallel_convolution import ParallelConvolution2D

    names = (
        "Deconvolution2D",
        "ConvolutionND",
        "DeconvolutionND",
        "DilatedConvolution2D",
        "DepthwiseConvolution2D",
        "LocalConvolution2D",
        "DeformableConvolution2D",
        "GroupNormalization",
        "BatchRenormalization",
        "DecorrelatedBatchNormalization",
    )
    found = tuple(getattr(L, n) for n in names if hasattr(L, n))
    return (*found, MultiNodeBatchNormalization, ParallelConvolution2D)


def _route_stored_functions(model: chainer.Link) -> None:
    """``chainer.Sequential`` entries that are Chainer's pooling/reduction functions (or
    ``functools.partial`` of them) hold the function itself, not its name: point them at the
    routed versions, which call Chainer's own on tensors that are not slabs."""
    originals = {fn: name for name, fn in spatial_pooling.ORIGINAL.items()}
    for link in model.links():
        if not isinstance(link, chainer.Sequential):
            continue
        for index, layer in enumerate(link._layers):
            if isinstance(layer, functools.partial) and layer.func in originals:
                routed = _route_table[originals[layer.func]]
                link._layers[index] = functools.partial(routed, *layer.args, **layer.keywords)
            elif not isinstance(layer, chainer.Link) and layer in originals:
                link._layers[index] = _route_table[originals[layer]]


def _convert_links(model: chainer.Link, group: SpatialGroup) -> int:
    """Make the model's splittable links slab-aware in place; refuse the unsplittable."""
    refused = _unsplittable()
    count = 0
    for path, link in model.namedlinks():
        where = path or "/"
        kind = type(link)
        if kind in _SPLIT:
            link.__class__ = _SPLIT[kind]
            link.spatial_group = group
            count += 1
        elif isinstance(link, refused):
            raise SpatialSplitError(
                f"layer {where} ({kind.__name__}) cannot be split into slabs of rows: "
                "spatial parallelism supports Convolution2D (any kernel, stride, padding, "
                "dilation), BatchNormalization, max/average pooling and global reductions"
            )
        elif isinstance(link, tuple(_SPLIT)) and kind not in _SPLIT.values():
            raise SpatialSplitError(
                f"layer {where} ({kind.__name__}) subclasses {kind.__mro__[1].__name__} with "
                "its own forward, which spatial parallelism cannot split: use the plain link"
            )
    return count


def _route(name: str) -> Callable[..., Any]:
    original = spatial_pooling.ORIGINAL[name]

    @functools.wraps(original)
    def routed(x: Any, *args: Any, **kwargs: Any) -> Any:
        current = active_group()
        layout = current.layout_of(x) if current is not None else None
        if current is None or layout is None:
            return original(x, *args, **kwargs)
        if name in ("max_pooling_2d", "average_pooling_2d"):
            fn = getattr(spatial_pooling, name)
            return fn(current, x, layout, *args, **kwargs)
        return spatial_pooling.reduce(current, x, layout, name, *args, **kwargs)

    return routed


class _RoutedFunctions:
    """``chainer.functions``' pooling and reductions replaced while a spatial model runs."""

    depth = 0

    def __enter__(self) -> None:
        if _RoutedFunctions.depth == 0:
            for name in spatial_pooling.ORIGINAL:
                setattr(F, name, _route_table[name])
        _RoutedFunctions.depth += 1

    def __exit__(self, *exc: object) -> None:
        _RoutedFunctions.depth -= 1
        if _RoutedFunctions.depth == 0:
            for name, fn in spatial_pooling.ORIGINAL.items():
                setattr(F, name, fn)


_route_table: dict[str, Callable[..., Any]] = {}


def _slab_input(group: SpatialGroup, x: Any) -> Any:
    if group.axis >= getattr(x, "ndim", 0):
        return x
    layout = SlabLayout.even(group.axis, int(x.shape[group.axis]), group.size)
    return InputSlab(group.comm, layout).apply((x,))[0]


def _finish(group: SpatialGroup, out: Any, keep_graph: bool) -> Any:
    """Whole outputs on every rank (slab outputs gathered); cut from the graph if asked."""
    if isinstance(out, (tuple, list)):
        return type(out)(_finish(group, o, keep_graph) for o in out)
    if isinstance(out, dict):
        return {k: _finish(group, v, keep_graph) for k, v in out.items()}
    if not isinstance(out, chainer.Variable):
        return out
    layout = group.layout_of(out)
    if layout is not None:
        out = gather_slabs(group.comm, out, layout)
    if not keep_graph:
        out = chainer.Variable(out.array, requires_grad=out.requires_grad)
    return out


def _spatial_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def spatial(self: chainer.Link, *args: Any, **kwargs: Any) -> Any:
        group: SpatialGroup = self.spatial_group
        keep_graph = bool(chainer.config.enable_backprop)
        with chainer.using_config("enable_backprop", True), group.calling(self), _RoutedFunctions():
            if args:
                args = (_slab_input(group, args[0]), *args[1:])
            out = forward(self, *args, **kwargs)
            return _finish(group, out, keep_graph)

    return spatial


_model_classes: dict[type, type] = {}


def _spatial_class(cls: type[chainer.Link]) -> type:
    """``cls`` with its forward wrapped (one subclass per model class, so copies keep it)."""
    made = _model_classes.get(cls)
    if made is None:
        made = type(cls.__name__, (cls,), {"forward": _spatial_forward(cls.forward)})
        made.__qualname__ = f"SpatialParallel[{cls.__qualname__}]"
        _model_classes[cls] = made
    return made


def create_spatial_parallel_model(
    model: chainer.Link,
    comm: CommunicatorBase,
    axis: str = "h",
    *,
    batch_norm_comm: CommunicatorBase | None = None,
    overlap: bool = True,
) -> chainer.Link:
    """A deep copy of ``model`` whose activations are split over ``comm`` along ``axis``
    (``'h'``: rows, ``'w'``: columns); the original is untouched, except a model that cannot be
    deep-copied (a ``chainer.Sequential`` holding a lambda), which is converted in place. See
    the module doc.

    ``batch_norm_comm``: the ranks batch statistics are taken over (default ``comm``); in a
    spatial x data layout pass the whole job's communicator for statistics over the combined
    batch, as one process would compute them. ``overlap``: convolutions post their halo
    exchange, compute the output rows that need no halo, then wait and compute the edges (False:
    wait first, then one convolution over the slab and its halo; same results).
    """
    if axis not in AXES:
        raise ValueError(f"axis must be 'h' or 'w', got {axis!r}")
    if not _route_table:
        for name in spatial_pooling.ORIGINAL:
            _route_table[name] = _route(name)
    state = np.random.get_state()
    try:
        clone = copy.deepcopy(model)
    except ValueError:
        clone = model  # a Sequential holding a lambda cannot be copied: converted in place
    finally:
        np.random.set_state(state)
    group = SpatialGroup(comm, AXES[axis], batch_norm_comm or comm, overlap)
    _convert_links(clone, group)
    _route_stored_functions(clone)
    if type(clone) in _SPLIT.values():
        raise SpatialSplitError("the model is a single layer: wrap it in a Chain")
    clone.__class__ = _spatial_class(type(clone))
    clone.spatial_group = group
    return clone


__all__ = ["SpatialSplitError", "create_spatial_parallel_model"]
