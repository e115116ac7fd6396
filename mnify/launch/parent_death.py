"""A process that dies with its parent: Linux's parent-death signal (``PR_SET_PDEATHSIG``).

``mnify run`` starts mpiexec, and mpiexec starts the ranks. When ``mnify run`` is SIGKILLed it
cannot stop anything, and when the launcher is SIGKILLed the ranks it started run on (quiet
ones until their script ends). So mpiexec is started with SIGTERM as its parent-death signal
(it then stops its ranks and removes its files as for any stop), and each rank asks for SIGKILL
should the launcher go (its files are reclaimed by ``mnify run`` or ``mnify doctor --clean``).

The kernel sends the signal when the *thread* that forked the process ends: ``mnify run`` starts
mpiexec from its main thread, and a rank's parent is the launcher's process. Elsewhere than Linux
this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] = libc.prctl
    return prctl


def die_with_parent(sig: int) -> bool:
    """Ask for ``sig`` when this process's parent ends; True if set. A parent already gone
    (this process re-parented before the call) ends this process with ``sig`` at once."""
    prctl = _prctl()
    if prctl is None:
        return False
    parent = os.getppid()
    if prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0) != 0:
        return False
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def preexec(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that sets ``sig`` as the child's parent-death
    signal (libc is loaded here, before the fork); None where it cannot."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def child() -> None:
        prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(128 + sig)

    return child
