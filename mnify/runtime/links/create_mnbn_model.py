"""create_mnbn_model: a copy of a model with every BatchNormalization made multi-node.

For models whose class the converter cannot edit (a library's ResNet, say): the construction
site becomes ``model = mn.links.create_mnbn_model(model, comm)``.
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING

import chainer

from mnify.runtime.links.batch_normalization import MultiNodeBatchNormalization

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


def _is_plain_batch_normalization(link: object) -> bool:
    """BatchNormalization and user subclasses of it; not BatchRenormalization.

    Batch renormalization corrects batch statistics with the running ones; replacing it with
    MultiNodeBatchNormalization would silently change the algorithm, so it is left as it is
    (with a warning: its statistics stay per rank).
    """
    if isinstance(link, chainer.links.BatchRenormalization):
        warnings.warn(
            f"create_mnbn_model: {type(link).__name__} {getattr(link, 'name', '')!r} is left "
            "as it is; its batch statistics stay per rank",
            stacklevel=4,
        )
        return False
    return isinstance(link, chainer.links.BatchNormalization)


def _convert_batch_normalization(
    bn: chainer.links.BatchNormalization, comm: CommunicatorBase, communication_backend: str
) -> MultiNodeBatchNormalization:
    """A MultiNodeBatchNormalization with ``bn``'s settings, parameters and running statistics."""
    channel_shape = None if bn.avg_mean is None else tuple(bn.avg_mean.shape)
    mnbn = MultiNodeBatchNormalization(
        channel_shape,
        comm,
        decay=bn.decay,
        eps=bn.eps,
        dtype=bn._highprec_dtype,
        use_gamma=bn.gamma is not None,
        use_beta=bn.beta is not None,
        communication_backend=communication_backend,
        axis=bn.axis,
    )
    mnbn.to_device(bn.device)
    for name in ("gamma", "beta"):
        source, dest = getattr(bn, name), getattr(mnbn, name)
        if source is not None and source.array is not None:
            dest.array = copy.deepcopy(source.array)
            dest.grad = None if source.grad is None else copy.deepcopy(source.grad)
    for name in ("avg_mean", "avg_var", "N"):
        setattr(mnbn, name, copy.deepcopy(getattr(bn, name)))
    mnbn.name = bn.name
    return mnbn


def _replace_in_place(link: chainer.Link, comm: CommunicatorBase, backend: str) -> None:
    """Swap every BatchNormalization below ``link`` (a private copy) for the multi-node one."""
    if isinstance(link, chainer.Chain):
        for name in sorted(link._children):
            child = getattr(link, name)
            if _is_plain_batch_normalization(child):
                link.__dict__[name] = _convert_batch_normalization(child, comm, backend)
            else:
                _replace_in_place(child, comm, backend)
    elif isinstance(link, chainer.Sequential):
        # Sequential calls its ``_layers`` (links and plain functions); ``_children`` holds the links.
        for index, layer in enumerate(list(link._layers)):
            if _is_plain_batch_normalization(layer):
                mnbn = _convert_batch_normalization(layer, comm, backend)
                link._layers[index] = mnbn
                position = next(i for i, c in enumerate(link._children) if c is layer)
                link._children[position] = mnbn
            elif isinstance(layer, chainer.Link):
                _replace_in_place(layer, comm, backend)
    elif isinstance(link, chainer.ChainList):
        for index, child in enumerate(list(link)):
            if _is_plain_batch_normalization(child):
                link._children[index] = _convert_batch_normalization(child, comm, backend)
            else:
                _replace_in_place(child, comm, backend)


def create_mnbn_model(
    link: chainer.Link, comm: CommunicatorBase, communication_backend: str = "auto"
) -> chainer.Link:
    """A deep copy of ``link`` in which every ``L.BatchNormalization`` is a MultiNodeBatchNormalization.

    Parameters, gradients and running statistics carry over, so converting a trained model keeps
    what it learnt. The original model is left untouched.
    """
    if _is_plain_batch_normalization(link):
        return _convert_batch_normalization(copy.deepcopy(link), comm, communication_backend)
    clone = copy.deepcopy(link)
    _replace_in_place(clone, comm, communication_backend)
    return clone
