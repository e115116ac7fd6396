"""An empty stand-in dataset for ranks whose model takes no input (model-parallel pipelines)."""

from __future__ import annotations

from collections.abc import Sized


def create_empty_dataset(dataset: Sized) -> list[tuple[()]]:
    """As many empty examples as ``dataset`` has, so iterators on every rank run the same steps.

    Used on ranks whose model starts with a ``recv`` and ends with a ``send``: they must iterate
    in step with the rank that holds the data, but need none of it.
    """
    return [()] * len(dataset)
