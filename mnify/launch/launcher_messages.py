"""What mpiexec says about the ranks: how they ended, and why they could not be started.

Open MPI (4 and 5) and MPICH word these differently; :func:`parse_launcher_messages` reads the
endings (aborts, signals, exit statuses) into :class:`RankExit` records and :func:`describe_exit`
says one in words; :func:`find_launch_problem` recognises a launch that failed (host names, ssh,
the hostfile, slots); :func:`lost_daemon` and :func:`fork_warning` spot two more messages.
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


# What PRTE prints when it loses a remote daemon (a host dropped off the network).
LOST_DAEMON = "lost communication with a remote daemon"
_FORK_WARNING = re.compile(r'involving a call to the\s+"fork\(\)" system call')


def lost_daemon(text: str) -> bool:
    """mpiexec lost a host's daemon while the job ran."""
    return LOST_DAEMON in text


def fork_warning(text: str) -> bool:
    """Open MPI warned that a rank called fork()."""
    return bool(_FORK_WARNING.search(text))


@dataclass(frozen=True)
class LaunchProblem:
    """Why mpiexec could not start the ranks: what it said, in short, and what to check."""

    what: str
    hint: str


_SSH_HINT = (
    "mpiexec starts the ranks on other hosts over ssh: `ssh HOST true` must work from this "
    "host without a password prompt (keys in ~/.ssh, the host in known_hosts)."
)
_NAME_HINT = (
    "every host name in --host or the hostfile must resolve on this host (DNS or /etc/hosts) "
    "and be reachable by ssh; `mnify doctor --hostfile FILE` checks the names."
)
_LAUNCH_PATTERNS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"[Cc]ould not resolve hostname (?P<host>[^\s:]+)"),
        "host name {host} does not resolve",
        _NAME_HINT,
    ),
    (
        re.compile(r"Host key verification failed|Permission denied \(publickey"),
        "ssh refused to log in to a host",
        _SSH_HINT,
    ),
    (
        re.compile(r"ssh: connect to host (?P<host>\S+) port \d+: (?P<why>[^\n]+)"),
        "ssh could not reach {host}: {why}",
        _SSH_HINT,
    ),
    (
        re.compile(r"parse error in the hostfile|hostfile.*(?:could not be parsed|parse error)"),
        "mpiexec could not read the hostfile",
        "a hostfile has one host a line: `node1 slots=4` for Open MPI, `node1:4` for MPICH; "
        "`mnify doctor --hostfile FILE` reads it the way mnify does.",
    ),
    (
        re.compile(r"not enough slots available", re.I),
        "the hosts offer fewer slots than ranks",
        "raise the slot counts in the hostfile or --host (node1:4), run fewer ranks, or pass "
        "--mpi-arg --oversubscribe on purpose.",
    ),
    (
        re.compile(r"unable to find the specified executable|unable to launch the specified"),
        "mpiexec could not start the Python interpreter on a host",
        "every host needs the same Python environment at the same path (a shared file system, "
        "or the same virtual environment installed on each).",
    ),
    (
        re.compile(
            r"daemon failed to report back|unable to reliably start one or more daemons"
            r"|HYDU_sock_connect|unable to connect from"
        ),
        "mpiexec could not start its daemon on a host",
        _NAME_HINT + " " + _SSH_HINT,
    ),
)


def find_launch_problem(text: str) -> LaunchProblem | None:
    """The first sign in mpiexec's output that it could not start the ranks."""
    for pattern, what, hint in _LAUNCH_PATTERNS:
        match = pattern.search(text)
        if match:
            return LaunchProblem(what.format(**match.groupdict()), hint)
    return None
