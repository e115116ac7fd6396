"""Ending a job that a rank has left while others wait for it in a collective.

Under mpi4py a rank whose script ends blocks in ``MPI_Finalize``; a rank still waiting for it in
a collective then waits forever and nothing prints an error. Each rank on this host publishes
its state (:mod:`mnify.runtime.rank_state`); :class:`EarlyExitWatch` reads the records and
reports a :class:`StrandedRanks` once a rank has been exiting and another has been waiting in
the same MPI call for ``exit_timeout`` seconds; the first such overlap that lasts a second is kept
(:attr:`EarlyExitWatch.first_overlap`), so ``mnify run`` can say at once who left and who waits. Ranks doing their own work are never stranded:
rank 0 running a post-training tail alone while the others have finished is healthy, and a wait
that completes (a final barrier racing the exit) starts the clock again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mnify.runtime.rank_state import Phase, RankRecord, read_record, record_path

# An exit and a wait must overlap this long before they are announced: a rank finishing a
# collective a moment after a peer has left it is not stranded.
NOTICE_AFTER = 1.0


@dataclass(frozen=True)
class StrandedRanks:
    """Ranks that left, and ranks left waiting for them."""

    exited: dict[int, int]  # rank -> exit status
    waiting: list[int]
    kind: str  # the collective the first waiting rank is in
    seq: int
    seconds: float  # how long the waiting has overlapped the exit


@dataclass
class _Seen:
    key: tuple[Phase, int]  # (phase, waits begun): a stuck wait keeps both
    since: float


class EarlyExitWatch:
    """Polls the rank records in ``directory`` for ``nprocs`` ranks."""

    def __init__(self, directory: str | Path, nprocs: int, exit_timeout: float) -> None:
        self.directory = Path(directory)
        self.nprocs = nprocs
        self.exit_timeout = exit_timeout
        self.records: dict[int, RankRecord] = {}
        self._seen: dict[int, _Seen] = {}
        # the first overlap seen (NOTICE_AFTER seconds long): announced at once, and the cause
        # of the job's end when the waiting ranks' watchdog ends it before exit_timeout does
        self.first_overlap: StrandedRanks | None = None

    def poll(self, now: float) -> StrandedRanks | None:
        """Read every record; the stranded ranks once the overlap has lasted long enough."""
        for rank in range(self.nprocs):
            record = read_record(record_path(self.directory, rank), rank)
            if record is None:
                continue
            self.records[rank] = record
            key = (record.phase, record.waits)
            seen = self._seen.get(rank)
            if seen is None or seen.key != key:
                self._seen[rank] = _Seen(key, now)
        overlap = self.overlap(now, min(NOTICE_AFTER, self.exit_timeout or NOTICE_AFTER))
        if overlap is not None and self.first_overlap is None:
            self.first_overlap = overlap
        if self.exit_timeout <= 0 or overlap is None:
            return None
        return self.overlap(now, self.exit_timeout)

    def overlap(self, now: float, lasted: float) -> StrandedRanks | None:
        """Ranks exiting while others have waited in a collective for ``lasted`` seconds."""
        exiting = {
            r: self._seen[r].since for r, rec in self.records.items() if rec.phase is Phase.EXITING
        }
        if not exiting:
            return None
        first_exit = min(exiting.values())
        waiting = {
            r: max(self._seen[r].since, first_exit)
            for r, rec in self.records.items()
            if rec.phase is Phase.WAITING
        }
        stuck = sorted(r for r, since in waiting.items() if now - since >= lasted)
        if not stuck:
            return None
        first = self.records[stuck[0]]
        return StrandedRanks(
            exited={r: self.records[r].status for r in sorted(exiting)},
            waiting=stuck,
            kind=first.kind,
            seq=first.seq,
            seconds=now - waiting[stuck[0]],
        )

    def pids(self) -> dict[int, int]:
        """Each rank's pid, from its record."""
        return {r: rec.pid for r, rec in self.records.items() if rec.pid > 0}

    def exiting(self, rank: int) -> bool:
        record = self.records.get(rank)
        return record is not None and record.phase is Phase.EXITING

    def started(self) -> set[int]:
        """Ranks that published a record: their script started."""
        return set(self.records)
