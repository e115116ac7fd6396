"""Files a rank other than 0 writes: every rank appending to one log, saving one snapshot.

A Python audit hook (``sys.addaudithook``; it cannot be removed, so it checks a flag and
returns) sees every write :mod:`mnify.runtime.file_writes` defines (``open()``, ``os.open``,
``pathlib``, NumPy's and Chainer's savers, ``os.rename``/``os.replace``) and lets its exempt
files pass: ``tempfile``'s, device files, bytecode caches, mnify's own, libraries' caches under
the home directory; making directories is no write (Chainer's Trainer makes its ``out`` on every
rank). The write net of every job (:mod:`mnify.runtime.write_net`) uses the same definition.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from mnify.runtime import user_frames
from mnify.runtime.file_writes import EVENTS, WriteFilter, made_by_tempfile, path_text


@dataclass(frozen=True)
class Write:
    what: str  # "opened for writing", "renamed SRC to"
    path: str  # as the script named it
    where: str


@dataclass
class WriteRecorder:
    recording: bool = False
    writes: list[Write] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _filter: WriteFilter = field(default_factory=WriteFilter)

    def install(self) -> None:
        self._filter = WriteFilter.for_this_rank()
        self.recording = True
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in EVENTS or not self.recording:
            return
        found = self._filter.write_of(event, args)
        if found is not None:
            self._note(*found)

    def _note(self, what: str, path: Any) -> None:
        named = path_text(path)
        if self._filter.exempt(os.path.abspath(named)):
            return
        kind, frame = user_frames.innermost(sys._getframe(2))
        if kind == "mnify":
            return
        if made_by_tempfile(sys._getframe(2)):
            return
        where = user_frames.describe(frame)
        if (named, where) in self._seen:
            return
        self._seen.add((named, where))
        if len(self.writes) < 100:
            self.writes.append(Write(what, named, where))
