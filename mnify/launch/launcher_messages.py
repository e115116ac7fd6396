"""What mpiexec says about how ranks ended: aborts, signals and exit statuses.

Open MPI (4 and 5) and MPICH word these differently; :func:`parse_launcher_messages` reads them
all into :class:`RankExit` records, and :func:`describe_exit` says one in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class RankExit:
    """What mpiexec said about a rank that ended the job."""

    rank: int | None  # None: mpiexec did not say which (MPICH 4+ names the PID only)
    how: str  # "abort", "signal" or "exit"
    code: int  # abort error code, signal number or exit status
    detail: str = ""  # "Killed", "Aborted", ...


_OMPI_SIGNAL = re.compile(
    r"noticed that process rank (?P<rank>\d+) with PID \d+ on node \S+ exited on\s+signal "
    r"(?P<sig>\d+)(?: \((?P<name>[^)]*)\))?"
)
_OMPI_ABORT_BY = re.compile(
    r"due to process rank (?P<rank>\d+) with PID \d+ on node \S+ calling\s+\"abort\""
)
_MPI_ABORT = re.compile(
    r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator \S+(?:.*?Errorcode: (?P<code>\d+))?",
    re.S,
)
_OMPI_EXIT = re.compile(
    r"exited with non-zero status.*?Process name: \[(?:\[\d+,\d+\],|[^@\]]*@\d+,)(?P<rank>\d+)\]\s+"
    r"Exit code:\s+(?P<code>\d+)",
    re.S,
)
_MPICH_ABORT = re.compile(r"Abort\((?P<code>\d+)\) on node \d+ \(rank (?P<rank>\d+) in comm 0\)")
_MPICH_EXIT_STRING = re.compile(r"EXIT STRING: (?P<name>[^(]+?) \(signal (?P<sig>\d+)\)")
_MPICH_BAD = re.compile(
    r"RANK (?P<rank>\d+) PID \d+ RUNNING AT \S+\s*=\s*(?:KILLED BY SIGNAL: (?P<sig>\d+)"
    r"(?: \((?P<name>[^)]*)\))?|EXIT STATUS: (?P<code>\d+))"
)


def parse_launcher_messages(text: str) -> list[RankExit]:
    """Rank endings reported in mpiexec's own output (and in ranks' MPI_ABORT banners)."""
    flat = re.sub(r"\s+", " ", text)
    found: dict[tuple[int | None, str], RankExit] = {}
    for m in _OMPI_SIGNAL.finditer(flat):
        rank, sig = int(m.group("rank")), int(m.group("sig"))
        found[(rank, "signal")] = RankExit(rank, "signal", sig, m.group("name") or "")
    for m in _MPI_ABORT.finditer(text):
        rank = int(m.group("rank"))
        found[(rank, "abort")] = RankExit(rank, "abort", int(m.group("code") or 1))
    for m in _OMPI_ABORT_BY.finditer(flat):
        rank = int(m.group("rank"))
        found.setdefault((rank, "abort"), RankExit(rank, "abort", 1))
    for m in _OMPI_EXIT.finditer(text):
        rank = int(m.group("rank"))
        found[(rank, "exit")] = RankExit(rank, "exit", int(m.group("code")))
    for m in _MPICH_BAD.finditer(flat):
        rank = int(m.group("rank"))
        if m.group("sig"):
            found[(rank, "signal")] = RankExit(
                rank, "signal", int(m.group("sig")), m.group("name") or ""
            )
        elif m.group("code") and int(m.group("code")) != 0:
            found[(rank, "exit")] = RankExit(rank, "exit", int(m.group("code")))
    for m in _MPICH_ABORT.finditer(flat):
        rank = int(m.group("rank"))
        found[(rank, "abort")] = RankExit(rank, "abort", int(m.group("code")))
    if not any(how == "signal" for _, how in found):
        for m in _MPICH_EXIT_STRING.finditer(flat):
            sig = int(m.group("sig"))
            found[(None, "signal")] = RankExit(None, "signal", sig, m.group("name").strip())
    return sorted(found.values(), key=lambda e: (-1 if e.rank is None else e.rank, e.how))


def who_ended(e: RankExit) -> str:
    return "a rank" if e.rank is None else f"rank {e.rank}"


def describe_exit(e: RankExit) -> str:
    """One rank ending as mpiexec reported it, in words."""
    if e.how == "abort":
        return f"{who_ended(e)} called MPI_Abort (code {e.code})"
    if e.how == "signal":
        name = f" ({e.detail})" if e.detail else ""
        return f"{who_ended(e)} was killed by signal {e.code}{name}"
    return f"{who_ended(e)} exited with status {e.code}"
