"""Which audit events write a file, and which written files are not the script's own.

Both watchers of a rank's writes read Python's audit events (``sys.addaudithook``):
``--verify``'s rank-writes check (:mod:`mnify.runtime.verify.rank_writes`) and the write net
that runs on every job (:mod:`mnify.runtime.write_net`). They share this one definition, so a
file one of them lets pass the other does too (docs/verify.md, docs/write_net.md).

A write is an ``open`` for writing, appending or creating (``open()`` modes with ``w``, ``a``,
``x`` or ``+``; ``os.open`` flags with ``O_WRONLY``, ``O_RDWR``, ``O_CREAT``, ``O_APPEND`` or
``O_TRUNC``; ``pathlib``, NumPy's and Chainer's savers all end there) and the target of an
``os.rename``/``os.replace`` (``shutil.move``; how Chainer's snapshots land in ``out``).

Not the script's own writes (exempt):

- files made through ``tempfile`` and anything written inside its directories (Chainer's
  snapshot writers save into a ``tempfile.mkdtemp`` directory, then move the file out);
- device and kernel files (``/dev``, ``/proc``, ``/sys``), bytecode caches (``__pycache__``,
  ``.pyc``);
- mnify's own files (the rank state and timeline directories);
- libraries' caches and settings under a hidden directory of the home directory
  (``~/.cache/matplotlib``, ``~/.chainer/dataset``): every rank's import or download touches
  them, and no rank check in the script is the fix.

Making directories is not a write (``mkdir`` is no ``open``: Chainer's Trainer makes its ``out``
on every rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from mnify import environment

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
EVENTS = frozenset({"open", "os.rename", "tempfile.mkstemp", "tempfile.mkdtemp"})
"""The audit events a write watcher handles; every other event returns at once."""
_SYSTEM_DIRS = ("/dev/", "/proc/", "/sys/")


def _home_hidden() -> str:
    """``/home/me/.``: the prefix of the hidden directories of the home directory."""
    home = os.path.expanduser("~")
    return os.path.join(os.path.abspath(home), ".") if home != "~" else "\0"


def path_text(path: Any) -> str:
    """A path argument as text (bytes and path-likes too); its repr when it is none."""
    try:
        return os.fsdecode(path)
    except TypeError:
        return repr(path)


@dataclass
class WriteFilter:
    """Tells writes from other events, and the script's writes from the exempt ones above.

    Keeps the directories and files ``tempfile`` made in this process, so :meth:`write_of`
    must see every event of :data:`EVENTS` (the tempfile ones included).
    """

    own_dirs: tuple[str, ...] = ()
    home_hidden: str = "\0"
    temporary: set[str] = field(default_factory=set)  # tempfile's files and directories

    @classmethod
    def for_this_rank(cls) -> WriteFilter:
        """With mnify's own directories as this rank's environment names them."""
        own = [environment.LAUNCH.read_or_default().rank_state_dir, environment.TIMELINE.read()]
        dirs = tuple(os.path.abspath(d) + os.sep for d in own if d)
        return cls(own_dirs=dirs, home_hidden=_home_hidden())

    def write_of(self, event: str, args: tuple[Any, ...]) -> tuple[str, Any] | None:
        """``(what, path)`` when the event writes a file (``what``: "opened for writing",
        "renamed SRC to"), else None; tempfile's events are noted here and give None."""
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(mode, str):
                if not ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
                    return None
            elif not isinstance(flags, int) or not flags & WRITE_FLAGS:
                return None
            if isinstance(path, int) or path is None:
                return None  # a file descriptor: its opening was seen already
            return "opened for writing", path
        if event == "os.rename":  # os.rename and os.replace
            if len(args) >= 2:
                return f"renamed {path_text(args[0])} to", args[1]
            return None
        if event.startswith("tempfile.") and args and isinstance(args[0], (str, bytes)):
            self.temporary.add(os.path.abspath(os.fsdecode(args[0])))
        return None

    def exempt(self, path: str) -> bool:
        """Whether an absolute path is one of the exempt files above (the frames aside:
        :func:`made_by_tempfile`)."""
        if path.startswith(_SYSTEM_DIRS) or path.endswith((".pyc", ".pyc.tmp")):
            return True
        if "__pycache__" in path.split(os.sep):
            return True
        if path.startswith(self.own_dirs) or path.startswith(self.home_hidden):
            return True
        return any(path == t or path.startswith(t + os.sep) for t in self.temporary)


def made_by_tempfile(frame: FrameType | None) -> bool:
    """A file ``tempfile`` is making (NamedTemporaryFile, mkstemp, TemporaryFile): its module
    is on the stack from ``frame`` out."""
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.sep + "tempfile.py"):
            return True
        frame = frame.f_back
    return False
