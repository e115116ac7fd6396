"""mpiexec's boxed messages about how a job ended, kept out of the live output.

Open MPI frames its reports between lines of dashes, MPICH between lines of ``=``. The ones
that only say how the job ended (a rank called ``MPI_Abort``, was killed by a signal, exited
non-zero) repeat what the failure summary states in one line, so :class:`BannerFilter` drops
them, and MPICH's one-line ``Abort(1) on node ...`` too, from the live output; the text still
reaches :func:`~mnify.launch.launcher_messages.parse_launcher_messages`. Every other box, such as the
warning about ``fork()``, is passed through whole.
"""

from __future__ import annotations

import re

_RULE = re.compile(r"^(?:-{20,}|={20,})\s*$")
_ENDING = re.compile(
    r"MPI_ABORT was invoked on rank|has exited due to process rank|noticed that process rank"
    r"|exited with non-zero status|BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
)
_ENDING_LINE = re.compile(r"^Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\)")

Source = int | None  # a rank, or None for mpiexec itself


class BannerFilter:
    """Per output source: hold a box until it closes, then drop it or release it."""

    def __init__(self) -> None:
        self._open: dict[Source, list[str]] = {}
        self._after_drop: set[Source] = set()

    def feed(self, source: Source, text: str) -> list[str]:
        """Lines to show now for ``text`` from ``source``."""
        box = self._open.get(source)
        if box is None:
            if _ENDING_LINE.match(text):
                return []
            if _RULE.match(text):
                self._open[source] = [text]
                return []
            if source in self._after_drop:
                self._after_drop.discard(source)
                if not text.strip():
                    return []  # the stray blank Open MPI prints after an abort box
            return [text]
        box.append(text)
        if not _RULE.match(text):
            return []
        del self._open[source]
        if _ENDING.search(" ".join(box)):
            self._after_drop.add(source)
            return []
        return box

    def flush(self) -> list[tuple[Source, str]]:
        """Boxes left open when the output ended: shown as they are."""
        out = [(source, line) for source, box in self._open.items() for line in box]
        self._open.clear()
        return out
