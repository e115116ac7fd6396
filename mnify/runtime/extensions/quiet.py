"""Keep an extension on every rank while only rank 0's copy prints.

An installed library's training helper registers extensions of its own classes (chainer-
chemistry's ``AutoPrintReport`` reads the ``LogReport`` and prints its table). Dropping one on
the other ranks, as Chainer's ``PrintReport`` is dropped, is right only when it does nothing but
report, and nothing at run time can tell that of a class it has not seen: it may also change a
learning rate or a model every rank must share. So the extension runs on every rank, and on the
ranks other than 0 what it writes to standard output and standard error while it runs goes
nowhere: the training is unchanged and its table is printed once (docs/multinode.md,
"Training inside a library helper"). The file descriptors are redirected too, since such an extension often
keeps the stream it was given at construction (``out=sys.stdout``), which no
``contextlib.redirect_stdout`` reaches.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

_QUIET = "_mn_quiet_on_this_rank"
_subclasses: dict[type, type] = {}


def _flush(streams: tuple[Any, ...]) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Everything written to standard output and error inside the block is dropped: through
    ``sys.stdout``/``sys.stderr`` whatever they are, through a stream object kept from before,
    and straight to file descriptors 1 and 2."""
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    _flush(streams)
    saved: dict[int, int] = {}
    with open(os.devnull, "w") as null:
        try:
            for fd in (1, 2):
                with contextlib.suppress(OSError):
                    saved[fd] = os.dup(fd)
                    os.dup2(null.fileno(), fd)
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                yield
        finally:
            _flush(streams)  # what a kept stream buffered goes to the null device too
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)


def _quiet_call(self: Any, trainer: Any) -> Any:
    with silenced():
        return super(type(self), self).__call__(trainer)


def _quiet_class(cls: type) -> type:
    """A subclass of ``cls`` whose ``__call__`` is silenced; same name, module and layout, so
    ``isinstance`` and the extension's own attributes are as before."""
    if cls not in _subclasses:
        _subclasses[cls] = type(
            cls.__name__,
            (cls,),
            {
                "__call__": _quiet_call,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__slots__": (),
                _QUIET: True,
            },
        )
    return _subclasses[cls]


def quiet_on_this_rank(extension: Any) -> Any | None:
    """``extension`` made silent where it is called (the object itself, its class swapped for a
    silenced subclass; for an extension that is a function, a silenced function with the same
    attributes, to register in its place); None when neither can be done."""
    if getattr(extension, _QUIET, False):
        return extension
    if isinstance(extension, types.FunctionType):
        function: Callable[..., Any] = extension

        @functools.wraps(function)
        def quiet(trainer: Any) -> Any:
            with silenced():
                return function(trainer)

        setattr(quiet, _QUIET, True)
        return quiet
    try:
        extension.__class__ = _quiet_class(type(extension))
    except TypeError:  # a built-in or extension-module class
        return None
    return extension


def quiet_on_other_ranks(extension: Any, comm: Any) -> Any:
    """``extension`` as it is on rank 0; elsewhere made silent (:func:`quiet_on_this_rank`).
    ``mnify convert`` wraps an installed package's extension in it: ``trainer.extend(
    mn.quiet_on_other_ranks(AutoPrintReport(), comm))``. Register what it returns. An extension
    that cannot be silenced (an instance of a class written in C) is returned as it is, with a
    warning on rank 0 only."""
    if comm.rank == 0:
        if not isinstance(extension, types.FunctionType) and not is_python_class(type(extension)):
            print(
                f"mnify: quiet_on_other_ranks: {type(extension).__name__} cannot be silenced; "
                "it prints on every rank",
                file=sys.stderr,
                flush=True,
            )
        return extension
    quiet = quiet_on_this_rank(extension)
    return extension if quiet is None else quiet


def is_python_class(cls: type) -> bool:
    """A class written in Python (its instances' ``__class__`` can be swapped)."""
    return bool(cls.__flags__ & (1 << 9))  # Py_TPFLAGS_HEAPTYPE
