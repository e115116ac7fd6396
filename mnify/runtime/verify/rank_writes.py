"""Files a rank other than 0 writes: every rank appending to one log, saving one snapshot.

A Python audit hook (``sys.addaudithook``; it cannot be removed, so it checks a flag and
returns) sees every ``open`` for writing, appending or creating (``open()``, ``os.open``,
``pathlib``, NumPy's and Chainer's savers) and every ``os.rename``/``os.replace`` (which
``shutil.move`` uses). Not findings: files made through ``tempfile`` (and what is written inside
its directories), device files, bytecode caches, mnify's own files, and making directories
(Chainer's Trainer makes its ``out`` on every rank; ``mkdir`` is not an ``open``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from mnify import environment
from mnify.runtime.verify import frames

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_EVENTS = frozenset({"open", "os.rename", "tempfile.mkstemp", "tempfile.mkdtemp"})
_SYSTEM_DIRS = ("/dev/", "/proc/", "/sys/")


@dataclass(frozen=True)
class Write:
    what: str  # "opened for writing", "renamed to"
    path: str  # as the script named it
    where: str


@dataclass
class WriteRecorder:
    recording: bool = False
    writes: list[Write] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _temporary: set[str] = field(default_factory=set)  # tempfile's files and directories
    _own_dirs: tuple[str, ...] = ()

    def install(self) -> None:
        own = [environment.LAUNCH.read().rank_state_dir, environment.TIMELINE.read()]
        self._own_dirs = tuple(os.path.abspath(d) + os.sep for d in own if d)
        self.recording = True
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _EVENTS or not self.recording:
            return
        if event.startswith("tempfile."):
            if args and isinstance(args[0], (str, bytes)):
                self._temporary.add(os.path.abspath(os.fsdecode(args[0])))
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(mode, str):
                if not any(c in mode for c in "wax+"):
                    return
            elif not isinstance(flags, int) or not flags & _WRITE_FLAGS:
                return
            self._note("opened for writing", path)
        else:  # os.rename and os.replace
            if len(args) >= 2:
                self._note(f"renamed {self._named(args[0])} to", args[1])

    @staticmethod
    def _named(path: Any) -> str:
        try:
            return os.fsdecode(path)
        except TypeError:
            return repr(path)

    def _exempt(self, named: str) -> bool:
        path = os.path.abspath(named)
        if path.startswith(_SYSTEM_DIRS) or path.endswith((".pyc", ".pyc.tmp")):
            return True
        if "__pycache__" in path.split(os.sep):
            return True
        if path.startswith(self._own_dirs):
            return True
        return any(path == t or path.startswith(t + os.sep) for t in self._temporary)

    def _note(self, what: str, path: Any) -> None:
        if isinstance(path, int) or path is None:
            return  # a file descriptor: its opening was seen already
        named = self._named(path)
        if self._exempt(named):
            return
        kind, frame = frames.innermost(sys._getframe(2))
        if kind == "mnify":
            return
        if _inside_tempfile():
            return
        where = frames.describe(frame)
        if (named, where) in self._seen:
            return
        self._seen.add((named, where))
        if len(self.writes) < 100:
            self.writes.append(Write(what, named, where))


def _inside_tempfile() -> bool:
    """A file ``tempfile`` is making (NamedTemporaryFile, mkstemp, TemporaryFile)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.sep + "tempfile.py"):
            return True
        frame = frame.f_back
    return False
