"""The job's processes seen from outside: which ranks live, whether the launcher outlives them,
and which Open MPI files are the job's.

Three failures only show from here:

- the launcher hangs after every rank has ended (``prterun`` deadlocked in its PMIx server, see
  docs/fault-tolerance.md): the ranks' pids (from their records,
  :mod:`mnify.runtime.rank_state`) are all gone while mpiexec still runs. ``mnify run`` then
  ends mpiexec ``LAUNCHER_GRACE`` seconds later and judges the job by the ranks' own reports;
- a rank dies without a word (SIGKILL, a native crash) and the launcher says nothing about it:
  its pid is gone while its record never reached "exiting" (:attr:`JobProcesses.vanished`);
- the launcher dies and leaves its files: the job's ``/dev/shm`` segments (read from the ranks'
  ``/proc/PID/maps`` while they run) and the launcher's ``TMPDIR/ompi.PID``, reclaimed once
  nobody holds them (:mod:`mnify.runtime.mpi_files`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mnify.runtime import mpi_files

LAUNCHER_GRACE = 5.0  # seconds mpiexec may outlive its last rank before it is ended
_MAPS_EVERY = 2.0  # seconds between two reads of the ranks' memory maps


@dataclass
class JobProcesses:
    """Follows ``nprocs`` ranks (by the pids their records give) and the launcher ``pid``."""

    launcher_pid: int
    nprocs: int
    ranks_gone_at: float | None = None  # when the last rank was seen gone
    vanished: list[int] = field(default_factory=list)
    gone: set[int] = field(default_factory=set)
    segments: set[str] = field(default_factory=set)
    _maps_at: float = 0.0

    def observe(self, now: float, pids: dict[int, int], exiting: set[int], quiet: bool) -> None:
        """Note which ranks have ended. ``exiting``: ranks whose record says their script ended;
        ``quiet``: nothing else has happened (no rank announced a failure, nobody stopped the
        job, the launcher lives), so a rank gone now without reaching its end vanished."""
        if not self.segments or now - self._maps_at >= _MAPS_EVERY:
            self._maps_at = now
            for pid in pids.values():
                self.segments |= mpi_files.mapped_paths(pid, [mpi_files.SHM_DIR])
        newly = {
            r for r, pid in pids.items() if r not in self.gone and not mpi_files.pid_alive(pid)
        }
        if quiet and not self.gone:
            self.vanished = sorted(r for r in newly if r not in exiting)
        self.gone |= newly
        if len(pids) == self.nprocs and self.gone >= set(pids):
            if self.ranks_gone_at is None:
                self.ranks_gone_at = now
        else:
            self.ranks_gone_at = None

    def launcher_outlived_ranks(self, now: float) -> bool:
        """Every rank has been gone ``LAUNCHER_GRACE`` seconds and the launcher still runs."""
        return (
            self.ranks_gone_at is not None
            and now - self.ranks_gone_at >= LAUNCHER_GRACE
            and mpi_files.pid_alive(self.launcher_pid)
        )

    def files(self) -> list[Path]:
        """The job's Open MPI entries seen so far (they may be gone already)."""
        own_dir = mpi_files.temp_dir() / f"ompi.{self.launcher_pid}"
        return [own_dir, *sorted(Path(p) for p in self.segments)]
