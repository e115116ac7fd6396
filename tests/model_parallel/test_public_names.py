"""The model-parallel names converted scripts use resolve through ``mnify.runtime``."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "path",
    [
        "functions.allgather",
        "functions.alltoall",
        "functions.bcast",
        "functions.gather",
        "functions.scatter",
        "functions.allreduce",
        "functions.send",
        "functions.recv",
        "functions.pseudo_connect",
        "links.ParallelConvolution2D",
        "links.MultiNodeChainList",
        "links.create_channel_parallel_model",
        "links.create_mnbn_model",
        "links.create_spatial_parallel_model",
        "GenericMultiNodeEvaluator",
        "extensions.GenericMultiNodeEvaluator",
        "iterators.create_multi_node_iterator",
        "iterators.create_synchronized_iterator",
        "create_multi_node_iterator",
        "create_synchronized_iterator",
    ],
)
def test_name_resolves(path: str) -> None:
    from mnify import runtime as mn

    obj: object = mn
    for part in path.split("."):
        obj = getattr(obj, part)
    assert callable(obj), path
