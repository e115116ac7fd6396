"""create_channel_parallel_model: a copy of a model whose convolutions are split over ranks.

``mnify convert --model-parallel channel`` never edits a model class (docs/design.md §0: no signature
changes); the place that builds the model becomes
``model = mn.links.create_channel_parallel_model(Net(...), comm)`` instead. A
``Convolution2D`` is split when it is initialised (its input channels are known), ungrouped, and
has at least ``comm.size`` output channels; the others stay whole, as the converter's own
``ParallelConvolution2D(...) if out >= comm.size else L.Convolution2D(...)`` decides.
Every rank must build the same model (the converter broadcasts rank 0's random state first):
each rank keeps its slice of the one set of weights.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import chainer
import numpy as np

from mnify.runtime.links.parallel_convolution import ParallelConvolution2D

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


def _splittable(link: object, comm: CommunicatorBase) -> bool:
    return (
        type(link) is chainer.links.Convolution2D
        and link.W.array is not None
        and link.groups == 1
        and link.out_channels >= comm.size
    )


def _split_in_place(link: chainer.Link, comm: CommunicatorBase) -> int:
    """Replace the splittable convolutions below ``link`` (a private copy); how many."""
    count = 0
    if isinstance(link, chainer.Sequential):
        for index, layer in enumerate(list(link._layers)):
            if _splittable(layer, comm):
                parallel = ParallelConvolution2D.from_convolution(comm, layer)
                link._layers[index] = parallel
                position = next(i for i, c in enumerate(link._children) if c is layer)
                link._children[position] = parallel
                count += 1
            elif isinstance(layer, chainer.Link):
                count += _split_in_place(layer, comm)
    elif isinstance(link, chainer.ChainList):
        for index, child in enumerate(list(link)):
            if _splittable(child, comm):
                link._children[index] = ParallelConvolution2D.from_convolution(comm, child)
                count += 1
            else:
                count += _split_in_place(child, comm)
    elif isinstance(link, chainer.Chain):
        for name in sorted(link._children):
            child = getattr(link, name)
            if _splittable(child, comm):
                parallel = ParallelConvolution2D.from_convolution(comm, child)
                parallel.name = name
                link.__dict__[name] = parallel
                count += 1
            else:
                count += _split_in_place(child, comm)
    return count


def create_channel_parallel_model(link: chainer.Link, comm: CommunicatorBase) -> chainer.Link:
    """A deep copy of ``link`` with its splittable ``Convolution2D`` layers channel-parallel
    (``ParallelConvolution2D.from_convolution``); the original is left untouched.

    Building the split layers draws initial weights that are then overwritten; numpy's global
    random state is restored afterwards, so layers initialised later (lazy ones) draw exactly
    what they would have drawn in the unconverted script."""
    state = np.random.get_state()
    try:
        if _splittable(link, comm):
            return ParallelConvolution2D.from_convolution(comm, link)
        clone = copy.deepcopy(link)
        _split_in_place(clone, comm)
        return clone
    finally:
        np.random.set_state(state)
