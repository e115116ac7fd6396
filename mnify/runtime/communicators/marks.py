"""Which communicator methods are collectives (every rank of the communicator must call them
together, or the job hangs): marked where they are defined, so the list is the code's own.

The mark also makes the method publish its enter and leave to the runtime's observers
(:mod:`mnify.runtime.observers`): one test of an empty list when nobody watches. A subclass's
override of a collective is one too, and is marked when the subclass is made
(:func:`mark_overrides`, from the communicator base's ``__init_subclass__``).

Lint keeps the same list as data (``mnify.vocabulary.COLLECTIVE_METHODS``), which the runtime
never imports; ``tests/runtime/test_collective_marks.py`` keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from mnify.runtime.observers import published_collective

F = TypeVar("F", bound=Callable[..., Any])

MARK = "__mnify_collective__"


def collective(method: F) -> F:
    """Mark ``method`` as a collective, publishing its enter and leave to the observers."""
    published = published_collective(method.__name__, method)
    setattr(published, MARK, True)
    return published


def collective_names(cls: type) -> frozenset[str]:
    """The collectives of ``cls``: methods marked in it or in a base class (an override of a
    collective is one too)."""
    return frozenset(
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if getattr(value, MARK, False)
    )


def mark_overrides(cls: type) -> None:
    """Mark (and so publish) the methods of ``cls`` that override a collective of a base class
    without the mark themselves (``pure_nccl``'s ``multi_node_mean_grad``, ...)."""
    inherited = frozenset(
        name
        for klass in cls.__mro__[1:]
        for name, value in vars(klass).items()
        if getattr(value, MARK, False)
    )
    for name in inherited:
        value = vars(cls).get(name)
        if callable(value) and not getattr(value, MARK, False):
            setattr(cls, name, collective(value))
