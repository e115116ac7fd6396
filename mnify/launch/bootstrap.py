"""What each rank runs under ``mnify run``: ``python -m mnify.launch.bootstrap SCRIPT ARGS``.

Output is made line-buffered (one write per line, so mpiexec tags whole lines and they arrive
as soon as they are printed).

Like ``python -m mpi4py SCRIPT`` it runs the script as ``__main__`` and ends the whole job with
``MPI_Abort`` when the script dies with an uncaught exception or a non-zero ``sys.exit``, so the
other ranks never wait forever in a collective. Unlike it, the failing rank first prints
``[mnify] rank R (host H) failed:`` and its traceback (the runtime's format, which ``mnify run``
parses), then waits ``MNIFY_ABORT_GRACE`` seconds (default 1) before aborting: an abort kills
every rank at once, and without the pause the ranks failing the same way a moment later are
killed before their tracebacks are out, so "the same error on every rank" would look like
"an error on rank 0 only". A non-zero ``sys.exit`` prints ``[mnify] rank R (host H) exited with
status N`` instead of a traceback.

It also starts :mod:`mnify.runtime.rank_state` and :mod:`mnify.runtime.write_net` (so the files
the script writes before it creates its communicator are seen too), and marks the rank as
exiting when the script ends, whatever its status: a rank leaving while others wait in a
collective is how a job hangs without any error, and ``mnify run`` ends such a job once it sees
both. And a rank started by a launcher dies with it (SIGKILL as its parent-death signal, :mod:`mnify.launch.parent_death`):
a SIGKILLed ``prterun`` otherwise leaves its ranks running.

A stop asked for through :mod:`mnify.runtime.update_watch` (``--verify``, ``mnify scale``) ends
every rank after the same update: the bootstrap prints ``[mnify] rank R (host H) stopped after
update N (status S): REASON`` and exits with S without aborting (every rank is there).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
import traceback
from typing import Any

from mnify import environment
from mnify.launch import parent_death
from mnify.runtime import rank_state


def abort_grace() -> float:
    """Seconds from ``MNIFY_ABORT_GRACE``; a bad value is said and ignored: the rank is failing."""
    return max(0.0, environment.ABORT_GRACE.read_or_default())


def _rank_and_host() -> tuple[int, str]:
    from mpi4py import MPI

    host = environment.HOSTNAME.read() or MPI.Get_processor_name()
    return int(MPI.COMM_WORLD.Get_rank()), host


def _failure_header() -> str:
    """The runtime's header (``mnify.runtime.excepthook``), built here without importing it."""
    rank, host = _rank_and_host()
    return f"[mnify] rank {rank} (host {host}) failed:"


def _report_exit(status: int, message: str) -> None:
    from mnify.launch.rank_reports import exit_report_line

    sys.stdout.flush()
    sys.stderr.write(exit_report_line(*_rank_and_host(), status, message) + "\n")
    sys.stderr.flush()


def _is_update_stop(exc: BaseException) -> bool:
    """:class:`mnify.runtime.update_watch.UpdateLimitReached`, without importing Chainer."""
    watch = sys.modules.get("mnify.runtime.update_watch")
    return watch is not None and isinstance(exc, watch.UpdateLimitReached)


def _report_stop(exc: Any) -> None:
    """The line ``mnify run`` reads as "stopped on purpose after update N"."""
    from mnify.runtime.update_watch import stop_report_line

    code = exc.code if isinstance(exc.code, int) else 1
    sys.stdout.flush()
    sys.stderr.write(stop_report_line(*_rank_and_host(), exc) + "\n")
    sys.stderr.flush()
    rank_state.exiting(code)


def _world_size() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_size()) if MPI.Is_initialized() else 1


def _abort(code: int) -> None:
    from mnify.runtime.abort import abort_job

    rank_state.exiting(code)
    abort_job(code)


def _user_traceback(exc: BaseException) -> str:
    """The traceback without this module's and runpy's frames."""
    tb = exc.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _run_script(path: str) -> None:
    """The script as ``__main__``; under ``mnify scale`` with its probes (the script's
    rank-0-guarded blocks timed: :mod:`mnify.runtime.scale_probe`), else as runpy runs it."""
    try:
        updates = environment.LAUNCH.read().scale_updates
    except environment.BadValue as exc:
        raise SystemExit(f"mnify: {exc}") from None
    if updates is None:
        runpy.run_path(path, run_name="__main__")
        return
    import types

    from mnify.runtime import scale_probe

    scale_probe.start(updates)
    code = scale_probe.compile_script(path)
    module = types.ModuleType("__main__")
    module.__file__ = path
    setattr(module, scale_probe.RANK0_HOOK, scale_probe.rank0_work)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _line_buffered() -> None:
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)


def main(argv: list[str]) -> None:
    _line_buffered()
    if not argv:
        sys.stderr.write("usage: python -m mnify.launch.bootstrap SCRIPT [ARGS...]\n")
        sys.exit(2)
    sys.argv[:] = argv
    sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    if rank_state.world_rank_from_env() is not None:
        parent_death.die_with_parent(signal.SIGKILL)  # a rank never outlives its launcher
    rank_state.start()
    if environment.WRITE_NET.read_or_default():  # record writes from the script's start
        from mnify.runtime import write_net

        write_net.start()
    if environment.VERIFY.is_set():  # mnify run --verify: watch from the script's start
        from mnify.runtime.verify import start_if_requested

        start_if_requested()
    try:
        _run_script(argv[0])
    except SystemExit as exc:
        if _is_update_stop(exc):
            _report_stop(exc)
            raise SystemExit(exc.code) from None  # every rank stops here: no abort

        code = exc.code
        if code is None or code == 0:
            rank_state.exiting(0)
            raise
        message = ""
        if not isinstance(code, int):
            message, code = str(code), 1
        _report_exit(code, message)
        _abort(code)
    except KeyboardInterrupt:
        _abort(130)
    except BaseException as exc:
        sys.stdout.flush()
        sys.stderr.write(f"{_failure_header()}\n{_user_traceback(exc)}")
        sys.stderr.flush()
        rank_state.exiting(1)
        if _world_size() > 1:
            time.sleep(abort_grace())
        _abort(1)
    else:
        rank_state.exiting(0)


if __name__ == "__main__":
    main(sys.argv[1:])
