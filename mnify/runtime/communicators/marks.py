"""Which communicator methods are collectives (every rank of the communicator must call them
together, or the job hangs): marked where they are defined, so the list is the code's own.

Lint keeps the same list as data (``mnify.vocabulary.COLLECTIVE_METHODS``), which the runtime
never imports; ``tests/runtime/test_collective_marks.py`` keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

MARK = "__mnify_collective__"


def collective(method: F) -> F:
    """Mark ``method`` as a collective; it is returned unchanged (no wrapper, no cost)."""
    setattr(method, MARK, True)
    return method


def collective_names(cls: type) -> frozenset[str]:
    """The collectives of ``cls``: methods marked in it or in a base class (an override of a
    collective is one too)."""
    return frozenset(
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if getattr(value, MARK, False)
    )
