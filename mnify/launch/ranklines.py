"""Attributing output lines to ranks.

mpiexec merges every rank's stdout into its own stdout (stderr likewise), tagging each line when
asked: Open MPI ``--tag-output`` writes ``[1,R]<stdout>: text`` (4.x without the space), MPICH
``-prepend-rank`` writes ``[R] text``. Lines without a tag come from mpiexec itself (its abort
and signal reports) and belong to no rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mnify.launch.mpiexec import Flavor

_OPENMPI_TAG = re.compile(
    r"^\[\d+,(?P<rank>\d+)\]<(?:stdout|stderr|stddiag)>: ?(?P<text>.*)$", re.S
)
_MPICH_TAG = re.compile(r"^\[(?P<rank>\d+)\] ?(?P<text>.*)$", re.S)


@dataclass(frozen=True)
class RankLine:
    """One line of output: the rank that printed it (None: mpiexec), and its text."""

    rank: int | None
    text: str
    stream: str  # "stdout" or "stderr"


def parse_line(line: str, flavor: Flavor, stream: str) -> RankLine:
    """Split the tag off ``line`` (no trailing newline) for the given MPI flavour."""
    pattern = {"openmpi": _OPENMPI_TAG, "mpich": _MPICH_TAG}.get(flavor)
    if pattern is not None:
        match = pattern.match(line)
        if match:
            return RankLine(int(match.group("rank")), match.group("text"), stream)
    return RankLine(None, line, stream)
