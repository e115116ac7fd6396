"""Which Open MPI files are a dead job's (:mod:`mnify.runtime.mpi_files`), on made-up
directories: never one a live process holds, never one too young to judge."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mnify.runtime import mpi_files

UID = os.getuid()


def _old(path: Path) -> Path:
    if not path.exists():
        path.write_bytes(b"x")
    then = time.time() - 3600
    os.utime(path, (then, then))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_dead_jobs_entries_are_found_and_live_ones_are_not(tmp_path: Path) -> None:
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    dead_segment = _old(shm / f"sm_segment.h.{UID}.1a2b0000.0")
    young = shm / f"sm_segment.h.{UID}.3c4d0000.0"
    young.write_bytes(b"x")
    _old(shm / f"sm_segment.h.{UID + 1}.5e6f0000.0")  # another user's
    _old(shm / "some-other-program")
    dead_launcher = tmp / f"ompi.{_dead_pid()}"
    (dead_launcher / "0").mkdir(parents=True)
    _old(dead_launcher)
    live_launcher = tmp / f"ompi.{os.getpid()}"
    live_launcher.mkdir()
    _old(live_launcher)
    singleton_root = tmp / f"ompi.h.{UID}" / "jf.0"
    dead_singleton = singleton_root / str(0x1A2B0000)
    dead_singleton.mkdir(parents=True)
    _old(dead_singleton)

    found = {
        (f.path, f.kind)
        for f in mpi_files.find_leftovers(min_age=30, shm_dir=shm, tmp_dir=tmp, uid=UID)
    }
    assert found == {
        (dead_segment, "segment"),
        (dead_launcher, "launcher-dir"),
        (dead_singleton, "singleton-dir"),
    }


def test_a_segment_held_open_or_mapped_is_live_and_so_is_its_singleton_dir(
    tmp_path: Path,
) -> None:
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    segment = shm / f"sm_segment.h.{UID}.77aa0000.0"
    segment.write_bytes(b"\0" * 4096)
    _old(segment)
    job_dir = tmp / f"ompi.h.{UID}" / "jf.0" / str(0x77AA0000)
    job_dir.mkdir(parents=True)
    _old(job_dir)
    code = (
        "import mmap, sys, time\n"
        f"f = open({str(segment)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 4096); f.close()\n"
        "print('mapped', flush=True); time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mapped"
        assert mpi_files.find_leftovers(min_age=0, shm_dir=shm, tmp_dir=tmp, uid=UID) == []
        assert mpi_files.reclaim([segment], shm_dir=shm) == []
    finally:
        holder.kill()
        holder.wait()
    found = {f.path for f in mpi_files.find_leftovers(min_age=0, shm_dir=shm, tmp_dir=tmp, uid=UID)}
    assert found == {segment, job_dir}
