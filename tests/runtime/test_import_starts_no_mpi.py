"""Importing the runtime starts no MPI: a converted script runs its forkserver preamble
(MultiprocessIterator) after ``from mnify import runtime as mn`` and before the communicator,
and a forkserver started from a process where MPI is initialised makes MPI_Finalize hang (every
2-rank run with a MultiprocessIterator hung at exit when one module imported mpi4py.MPI at the
top)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import mnify.runtime

# what a converted script reaches before its communicator: the runtime package and its Chainer-
# facing datasets, iterators, extensions, links and functions (the communicators, the optimizer
# wrapper, the trainers' distribution and the verify session start MPI when imported, and are
# only reached once a communicator is made)
BEFORE_THE_COMMUNICATOR = ("datasets", "iterators", "extensions", "links", "functions")


def test_importing_the_runtimes_chainer_facing_modules_initialises_no_mpi() -> None:
    prefixes = tuple(f"mnify.runtime.{p}" for p in BEFORE_THE_COMMUNICATOR)
    names = ["mnify.runtime"] + sorted(
        m.name
        for m in pkgutil.walk_packages(mnify.runtime.__path__, "mnify.runtime.")
        if m.name.startswith(prefixes)
    )
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "mpi = sys.modules.get('mpi4py.MPI')\n"
        "print('initialised' if mpi is not None and mpi.Is_initialized() else 'not initialised')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "not initialised", names
