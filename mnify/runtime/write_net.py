"""The write net: files two ranks wrote, found at the end of every run, whatever the converter saw.

The converter guards the writes it finds (docs/design.md §1); a write it cannot see (a method of
another module that ``json.dump``\\s to ``open(..., "w")`` after training, a library's helper)
runs on every rank. So on every job under the runtime each rank records the files it writes, and
at a normal end rank 0 names:

- a file two ranks wrote (``same-file``): ``mnify: rank 1 also wrote result/model.json
  (train.py:51 -> nets.py:77): guard it with if comm.rank == 0``;
- a file a rank other than 0 wrote into a directory rank 0 writes files to
  (``rank-0-directory``), unless its name carries the rank (``log_1.txt`` beside rank 0's
  ``log_0.txt``, ``rank1.json``).

What counts as a write and which files are exempt (``tempfile``'s, device files, bytecode
caches, mnify's own, libraries' caches under the home directory) is
:mod:`mnify.runtime.file_writes`, shared with ``--verify``'s rank-writes check. The line named
is :func:`mnify.runtime.user_frames.call_chain`'s: the entry script's line that led to the write,
then the line that wrote.

Cost. An audit hook sees every audited event of the process (imports, opens, ``os.*`` calls);
this one returns after one set lookup for all but ``open``/``os.rename``/tempfile's, after a
mode test for reads, and after one dict lookup for a file it already has: only a file's first
write walks the stack. ``bench/write_net.py`` measures it on the bundled MNIST example.

The exchange. Only after the exit barrier of :mod:`mnify.runtime.finalize` (a normal end: a
rank that died or hangs never gets there, and then nothing is exchanged), on that module's
private communicator: each rank sends its record to rank 0, which waits a bounded time for
each; a rank whose wait at the barrier ran out sends a one-byte note instead, so the one that
comes later does not wait for it. Under ``mnify run`` (``write_net_report`` in ``MNIFY_LAUNCH``) rank 0 prints one
JSON line that the launcher renders and puts in ``--summary-json`` (``shared_writes``); under a
plain mpiexec it prints the lines itself. ``MNIFY_WRITE_NET=0`` turns all of it off.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mnify import environment
from mnify.runtime import user_frames
from mnify.runtime.errors import format_ranks
from mnify.runtime.file_writes import EVENTS, WriteFilter, made_by_tempfile, path_text

REPORT_PREFIX = "[mnify] shared writes: "  # mnify.launch.rank_reports.WRITE_NET_PREFIX
KINDS = ("same-file", "rank-0-directory")
MAX_FILES = 2000  # files a rank records (a rank writing per-example images stops there)
MAX_SKIPPED = 10_000  # exempt files remembered, so their next opens return early
EXCHANGE_SECONDS = 10.0  # how long rank 0 waits for a rank's record after the exit barrier
_TAG, _TAG_GONE = 7321, 7322
READ_MODES = frozenset({"r", "rb", "rt", "br", "tr"})  # open()'s and io.open_code's read modes


@dataclass(frozen=True)
class SharedWrite:
    """One file a rank should not have written (``--summary-json``'s ``shared_writes`` item)."""

    path: str  # relative to rank 0's working directory when inside it
    ranks: list[int]  # the ranks that should not have written it
    where: str  # the first of those ranks' call chain: "train.py:51 -> nets.py:77"
    kind: str  # one of KINDS


@dataclass
class NetReport:
    """What rank 0 found: the files, and the ranks it could not judge in full."""

    shared_writes: list[SharedWrite] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)  # no record within EXCHANGE_SECONDS
    left_ranks: list[int] = field(default_factory=list)  # gave up waiting for rank 0 at exit
    truncated_ranks: list[int] = field(default_factory=list)  # recorded MAX_FILES, then stopped

    def as_data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> NetReport:
        return cls(
            shared_writes=[SharedWrite(**w) for w in data.get("shared_writes", [])],
            missing_ranks=list(data.get("missing_ranks", [])),
            left_ranks=list(data.get("left_ranks", [])),
            truncated_ranks=list(data.get("truncated_ranks", [])),
        )


# -- recording (every rank) --------------------------------------------------------------------


@dataclass
class WriteRecord:
    """The files this rank wrote: absolute path -> call chain of its first write."""

    files: dict[str, str] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)  # exempt or mnify's own: not looked at again
    truncated: bool = False
    filter: WriteFilter = field(default_factory=WriteFilter)

    def note(self, path: Any, frame: Any) -> None:
        """A write of ``path`` by the code of ``frame`` (its first one is kept)."""
        named = os.path.abspath(path_text(path))
        if named in self.files or named in self.skipped:
            return
        where = None
        if not self.filter.exempt(named) and not made_by_tempfile(frame):
            where = user_frames.call_chain(frame)  # None: mnify's own file
        if where is None:
            if len(self.skipped) < MAX_SKIPPED:
                self.skipped.add(named)
        elif len(self.files) < MAX_FILES:
            self.files[named] = where
        else:
            self.truncated = True


def audit_hook(record: WriteRecord) -> Callable[[str, tuple[Any, ...]], None]:
    """The hook: almost nothing for an event that writes no file, or a file already recorded."""
    events = EVENTS
    write_of = record.filter.write_of
    getframe = sys._getframe

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in events:
            return
        try:
            if event == "open" and args[1] in READ_MODES:
                return  # imports, datasets: most opens read
            found = write_of(event, args)
            if found is not None:
                record.note(found[1], getframe(1))
        except Exception:
            return  # an exception here would fail the user's open (sys.audit("open") by hand)

    return hook


_record: WriteRecord | None = None
_reporting = False


def enabled() -> bool:
    """``MNIFY_WRITE_NET`` (on unless set to 0)."""
    return environment.WRITE_NET.read()


def start() -> WriteRecord:
    """Record this rank's writes from now on; once per process (the bootstrap calls it before
    the script runs, ``create_communicator`` under a plain mpiexec). Imports no MPI: a script
    may still set ``mpi4py.rc`` before MPI starts."""
    global _record
    if _record is None:
        _record = WriteRecord(filter=WriteFilter.for_this_rank())
        sys.addaudithook(audit_hook(_record))
    return _record


def report_at_exit() -> None:
    """Exchange the records and report at a normal exit (``create_communicator`` calls it,
    after arranging the exit barrier); once per process."""
    global _reporting
    if not _reporting:
        from mnify.runtime import finalize

        finalize.at_exit_barrier(_at_exit)
        _reporting = True


def current() -> WriteRecord | None:
    return _record


# -- at exit: the exchange and the report (rank 0) ------------------------------------------------


def _at_exit(comm: Any, every_rank_came: bool) -> None:
    """After the exit barrier: send the records to rank 0, which reports; or, when this rank's
    wait ran out, leave a note that it is gone. Never raises (the rank is leaving) and never
    waits longer than :data:`EXCHANGE_SECONDS`."""
    record = _record
    if record is None or comm.Get_size() < 2:
        return
    try:
        if not every_rank_came:
            leave_note(comm)
            return
        report = exchange(comm, record)
        if report is not None and comm.Get_rank() == 0:
            say(report)
    except Exception as exc:  # the net must never be why a rank fails to leave
        sys.stderr.write(f"mnify: the write net could not report: {exc!r}\n")


def leave_note(comm: Any) -> None:
    """This rank gave up waiting at the exit barrier: tell those who may still exchange (rank
    0, or rank 0 the others) with a one-byte message, sent without waiting for its receipt."""
    from mpi4py import MPI

    rank = comm.Get_rank()
    note = bytearray(1)
    targets = range(1, comm.Get_size()) if rank == 0 else [0]
    requests = [comm.Isend([note, MPI.BYTE], dest=t, tag=_TAG_GONE) for t in targets]
    deadline = time.monotonic() + 1.0  # a byte goes out at once (eagerly) in every MPI
    while not MPI.Request.Testall(requests) and time.monotonic() < deadline:
        time.sleep(0.001)


def _gone(comm: Any, source: int) -> bool:
    """Whether ``source`` left a note that it gave up at the exit barrier (and take it)."""
    from mpi4py import MPI

    if not comm.Iprobe(source=source, tag=_TAG_GONE):
        return False
    comm.Recv([bytearray(1), MPI.BYTE], source=source, tag=_TAG_GONE)
    return True


def exchange(comm: Any, record: WriteRecord) -> NetReport | None:
    """Rank 0's report from every rank's record (None on the other ranks)."""
    mine = (record.files, record.truncated)
    deadline = time.monotonic() + EXCHANGE_SECONDS
    if comm.Get_rank() != 0:
        if _gone(comm, 0):
            return None  # rank 0 left before this rank came: nobody to tell
        request = comm.isend(mine, dest=0, tag=_TAG)
        while not request.Test():
            if time.monotonic() > deadline:
                request.Cancel()
                return None
            time.sleep(0.001)
        return None
    files: dict[int, dict[str, str]] = {0: record.files}
    report = NetReport(truncated_ranks=[0] if record.truncated else [])
    for source in range(1, comm.Get_size()):
        while True:
            if comm.Iprobe(source=source, tag=_TAG):
                theirs, overflowed = comm.recv(source=source, tag=_TAG)
                files[source] = theirs
                if overflowed:
                    report.truncated_ranks.append(source)
                break
            if _gone(comm, source):
                report.left_ranks.append(source)
                break
            if time.monotonic() > deadline:
                report.missing_ranks.append(source)
                break
            time.sleep(0.001)
    report.shared_writes = judge(files, os.getcwd())
    return report


# -- judging (pure) -------------------------------------------------------------------------------


def _shown(path: str, cwd: str) -> str:
    rel = os.path.relpath(path, cwd)
    return path if rel.startswith("..") else rel


def _rank_pattern(rank: int) -> re.Pattern[str]:
    return re.compile(rf"(?<!\d){rank}(?!\d)")


_RANK_WORD = r"(?:rank|proc|process|worker|node)[-_.]?"


def per_rank_name(path: str, rank: int, files: Mapping[int, Mapping[str, str]]) -> bool:
    """Whether ``rank``'s file is named for it: ``rank1.log``, ``worker_1.json``, or a number
    that is the rank where another rank wrote the same name with its own (``log_0.txt`` and
    ``log_1.txt`` in one directory)."""
    folder, name = os.path.split(path)
    number = _rank_pattern(rank)
    if not number.search(name):
        return False
    if re.search(rf"{_RANK_WORD}(?<!\d){rank}(?!\d)", name, re.IGNORECASE):
        return True
    template = number.sub("\0", name)
    for other, written in files.items():
        if other == rank:
            continue
        theirs = _rank_pattern(other)
        for their_path in written:
            their_folder, their_name = os.path.split(their_path)
            if their_folder == folder and theirs.sub("\0", their_name) == template:
                return True
    return False


def judge(files: Mapping[int, Mapping[str, str]], cwd: str) -> list[SharedWrite]:
    """The files ranks should not have written, from each rank's record (path -> where)."""
    writers: dict[str, list[int]] = {}
    for rank in sorted(files):
        for path in files[rank]:
            writers.setdefault(path, []).append(rank)
    rank0_dirs = {os.path.dirname(p) for p in files.get(0, {})}
    found = []
    for path, ranks in sorted(writers.items()):
        if len(ranks) > 1:
            others = ranks[1:]
            found.append(
                SharedWrite(_shown(path, cwd), others, files[others[0]][path], "same-file")
            )
        elif (
            ranks[0] != 0
            and os.path.dirname(path) in rank0_dirs
            and not per_rank_name(path, ranks[0], files)
        ):
            found.append(
                SharedWrite(_shown(path, cwd), ranks, files[ranks[0]][path], "rank-0-directory")
            )
    return found


# -- the words ----------------------------------------------------------------------------------


def _who(ranks: list[int]) -> str:
    return f"rank {format_ranks(ranks)}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def render(report: NetReport) -> list[str]:
    """One line per write site: files written at one place by the same ranks into one directory
    (a snapshot every epoch) are one line naming the first and how many more."""
    groups: dict[tuple[str, tuple[int, ...], str, str], list[str]] = {}
    for w in report.shared_writes:
        key = (w.kind, tuple(w.ranks), w.where, os.path.dirname(w.path))
        groups.setdefault(key, []).append(w.path)
    lines = []
    for (kind, ranks, where, folder), paths in groups.items():
        more = f" and {len(paths) - 1} more file{'s' if len(paths) > 2 else ''} like it"
        named = paths[0] + (more if len(paths) > 1 else "")
        who = _who(list(ranks))
        if kind == "same-file":
            lines.append(
                f"mnify: {who} also wrote {named} ({where}): guard it with if comm.rank == 0"
            )
        else:
            lines.append(
                f"mnify: {who} wrote {named} beside rank 0's files in {folder or '.'} ({where}): "
                "guard it with if comm.rank == 0, or put the rank in its name"
            )
    if report.truncated_ranks:
        lines.append(
            f"mnify: {_who(report.truncated_ranks)} wrote more than {MAX_FILES} files: the write "
            "net looked at the first ones only"
        )
    if report.left_ranks:
        lines.append(
            f"mnify: the write net did not see the files of {_who(report.left_ranks)}: "
            "it left before rank 0 ended (more than MNIFY_EXIT_BARRIER seconds earlier)"
        )
    if report.missing_ranks:
        lines.append(
            f"mnify: the write net heard nothing from {_who(report.missing_ranks)} at exit "
            f"within {EXCHANGE_SECONDS:g} s: their writes are not in the lines above"
        )
    return lines


def say(report: NetReport) -> None:
    """Rank 0's words: one JSON line for ``mnify run``, else the lines themselves (on stderr)."""
    sys.stdout.flush()
    if environment.LAUNCH.read_or_default().write_net_report:
        sys.stderr.write(REPORT_PREFIX + json.dumps(report.as_data()) + "\n")
    else:
        for line in render(report):
            sys.stderr.write(line + "\n")
    sys.stderr.flush()
