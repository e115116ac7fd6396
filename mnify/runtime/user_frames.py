"""Whose code is running: the user's script, a library (the standard library, site-packages),
or mnify's runtime. ``where`` in a finding is the user's innermost ``file:line``; for a write,
:func:`call_chain` also names the line of the entry script that led there.

Shared by ``--verify`` (:mod:`mnify.runtime.verify`) and the write net
(:mod:`mnify.runtime.write_net`), which runs on every job and so must not import verify."""

from __future__ import annotations

import os
import sysconfig
from types import FrameType

_MNIFY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOTSTRAP = os.path.join(_MNIFY_DIR, "launch", "bootstrap.py")
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.abspath(p) + os.sep
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (p := sysconfig.get_paths().get(key))
        }
    )
)


def kind_of(filename: str) -> str:
    """``"mnify"``, ``"library"`` or ``"user"`` for a code object's file name."""
    if filename.startswith("<"):
        return "library"  # <frozen runpy>, <string>: not a file the user can open
    path = os.path.abspath(filename)
    if path.startswith(_MNIFY_DIR + os.sep):
        return "library" if path == _BOOTSTRAP else "mnify"
    if path.startswith(_LIBRARY_DIRS):
        return "library"
    return "user"


def innermost(frame: FrameType | None) -> tuple[str, FrameType | None]:
    """The kind of the innermost frame that is not a library's, and that frame."""
    while frame is not None:
        kind = kind_of(frame.f_code.co_filename)
        if kind != "library":
            return kind, frame
        frame = frame.f_back
    return "library", None


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of the user's own code (skipping libraries and mnify)."""
    while frame is not None:
        if kind_of(frame.f_code.co_filename) == "user":
            return frame
        frame = frame.f_back
    return None


def describe(frame: FrameType | None) -> str:
    """``train.py:42``, relative to the working directory when inside it."""
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    try:
        rel = os.path.relpath(name)
        if not rel.startswith(".."):
            name = rel
    except ValueError:
        pass
    return f"{name}:{frame.f_lineno}"


def call_chain(frame: FrameType | None) -> str | None:
    """Where a write comes from, for a person to find it: ``train.py:51 -> nets.py:77``.

    The right side is the innermost frame that is not a library's (the line that called
    ``open``, ``np.save``, ``trainer.run()``); the left side the innermost line of the entry
    script (the file of the outermost user frame) that led there, left out when it is the same
    frame. None when the innermost such frame is mnify's own (its files are not the script's).
    """
    kind, inner = innermost(frame)
    if kind == "mnify":
        return None
    if inner is None:
        return "?"
    outermost = inner
    walker = inner.f_back
    while walker is not None:
        if kind_of(walker.f_code.co_filename) == "user":
            outermost = walker
        walker = walker.f_back
    entry_file = outermost.f_code.co_filename
    # the innermost frame of the entry file: the line in main(), not the module's main() call
    entry: FrameType | None = inner
    while entry is not None and entry.f_code.co_filename != entry_file:
        entry = entry.f_back
    if entry is inner:
        return describe(inner)
    return f"{describe(entry)} -> {describe(inner)}"
