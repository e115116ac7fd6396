"""``logging.config.dictConfig`` on every rank: rank 0 keeps the configuration's log files, the
other ranks log to the console instead (docs/converter.md, MN814).

Every rank that runs ``dictConfig`` with a ``FileHandler`` (or a rotating or watched one, or a
subclass) opens and appends to the same file. The converter hands the configuration through
:func:`rank0_log_files` on its way to ``dictConfig``: rank 0 gets it as written; the others get
a copy in which each file handler is a ``logging.StreamHandler`` with the same level, formatter
and filters, so loggers, formats and levels stay the same everywhere. Plain Python: no Chainer,
no MPI of its own (the communicator says which rank this is).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Protocol

# what a file handler's entry keeps when it becomes a console handler (the rest, filename, mode,
# maxBytes, when ..., are the file handler's constructor arguments)
_KEPT_KEYS = ("level", "formatter", "filters")


class _HasRank(Protocol):
    @property
    def rank(self) -> int: ...


def _handler_class(spec: Any) -> type | None:
    """The class a dictConfig handler entry names (``'class'``: a dotted path or a class)."""
    if not isinstance(spec, dict):
        return None
    named = spec.get("class")
    if isinstance(named, type):
        return named
    if not isinstance(named, str) or "." not in named:
        return None
    module, _, attr = named.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None  # dictConfig itself will say what is wrong with it
    return found if isinstance(found, type) else None


def is_file_handler(spec: Any) -> bool:
    """Whether a dictConfig handler entry makes a handler that writes a file."""
    cls = _handler_class(spec)
    return cls is not None and issubclass(cls, logging.FileHandler)


def rank0_log_files(config: dict[str, Any], comm: _HasRank) -> dict[str, Any]:
    """``config`` on rank 0; elsewhere a copy whose file handlers log to the console."""
    if comm.rank == 0 or not isinstance(config, dict):
        return config
    handlers = config.get("handlers")
    if not isinstance(handlers, dict) or not any(map(is_file_handler, handlers.values())):
        return config
    console = {}
    for name, spec in handlers.items():
        if is_file_handler(spec):
            kept = {k: spec[k] for k in _KEPT_KEYS if k in spec}
            console[name] = {"class": "logging.StreamHandler", **kept}
        else:
            console[name] = spec
    return {**config, "handlers": console}
