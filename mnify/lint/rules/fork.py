"""MN2xx: fork under MPI. Open MPI's registered memory does not survive ``fork()``: a child
process can corrupt the parent's buffers, and the job dies with ``mpirun noticed that process
rank 0 ... exited on signal 6 (Aborted)`` or hangs."""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.lint.context import LintContext
from mnify.lint.rule import Rule
from mnify.syntax import argument, string_value

_SAFE_START_METHODS = ("forkserver", "spawn")


def start_method(ctx: LintContext, call: cst.Call) -> str | None:
    """The method string of ``multiprocessing.set_start_method(...)``/``get_context(...)``."""
    names = ctx.callee_names(call)
    if N.any_in(names, N.START_METHOD_SETTERS | N.START_METHOD_CONTEXTS):
        return string_value(argument(call, 0, "method"))
    return None


class DumpGraphUnderMpi(Rule):
    """Fires on every ``extensions.DumpGraph(...)`` or ``extensions.dump_graph(...)`` call (any
    import style) in a training script, guarded by a rank check or not: the rank that runs it
    still forks."""

    code = "MN201"
    name = "dump-graph-forks"
    summary = "DumpGraph starts a subprocess (fork) inside an MPI job"
    why = (
        "DumpGraph shells out (graphviz) through subprocess, which forks the MPI process; under "
        "Open MPI the job aborts with signal 6 or corrupts memory. Dump the graph in a "
        "single-process run with small data instead."
    )
    bad = "trainer.extend(extensions.DumpGraph('main/loss'))\n"
    good = "# dump the graph from a single-process run, not from the MPI job\n"

    def visit_Call(self, node: cst.Call) -> None:
        if any(N.is_dump_graph(name) for name in self.ctx.callee_names(node)):
            self.report(node)


class MultiprocessIteratorWithoutForkserver(Rule):
    """Fires on each ``chainer.iterators.MultiprocessIterator(...)`` call when the script lacks
    the forkserver preamble: a ``multiprocessing.set_start_method('forkserver')`` call and a
    ``multiprocessing.Process(...)`` construction, both before the first communicator is created
    (earlier in the same function, or at module level when the communicator is created inside a
    function). In a script without a communicator both calls must simply exist."""

    code = "MN202"
    name = "multiprocess-iterator-without-forkserver"
    summary = "MultiprocessIterator without the forkserver preamble before the communicator"
    why = (
        "MultiprocessIterator forks worker processes. Forking after MPI is initialised breaks "
        "Open MPI (signal 6, hangs). Starting a forkserver before the communicator exists makes "
        "later workers come from a clean, MPI-free process."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "it = chainer.iterators.MultiprocessIterator(train, 32)\n"
    )
    good = (
        "multiprocessing.set_start_method('forkserver')\n"
        "p = multiprocessing.Process()\n"
        "p.start()\n"
        "p.join()\n"
        "comm = chainermn.create_communicator()\n"
        "it = chainer.iterators.MultiprocessIterator(train, 32)\n"
    )
    fixable = True

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._iterators: list[cst.Call] = []
        # (call index, scope node) of the first forkserver setting and process construction
        self._forkserver: tuple[int, cst.CSTNode] | None = None
        self._process: tuple[int, cst.CSTNode] | None = None
        self._communicator: tuple[int, cst.CSTNode] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        names = ctx.callee_names(node)
        if not names:
            return
        here = (ctx.call_index, ctx.scope_node)
        if N.any_is(names, N.is_multiprocess_iterator):
            self._iterators.append(node)
        elif N.any_in(names, N.START_METHOD_SETTERS):
            if start_method(ctx, node) == "forkserver" and self._forkserver is None:
                self._forkserver = here
        elif N.any_in(names, N.PROCESS_CLASS):
            if self._process is None:
                self._process = here
        elif N.any_in(names, N.COMMUNICATOR_FACTORIES) and self._communicator is None:
            self._communicator = here

    def finish(self) -> None:
        if self._preamble_ok():
            return
        for node in self._iterators:
            self.report(node)

    def _preamble_ok(self) -> bool:
        if self._forkserver is None or self._process is None:
            return False
        if self._communicator is None:
            return True
        return _before(self._forkserver, self._communicator) and _before(
            self._process, self._communicator
        )


def _before(first: tuple[int, cst.CSTNode], second: tuple[int, cst.CSTNode]) -> bool:
    """``first`` runs before ``second``: earlier in one scope, or module level vs a function."""
    if first[1] is second[1]:
        return first[0] < second[0]
    return isinstance(first[1], cst.Module)


class SubprocessUnderMpi(Rule):
    """Fires on calls that start a child process through fork/exec: ``subprocess.run``/``call``/
    ``check_call``/``check_output``/``Popen``/``getoutput``/``getstatusoutput``, ``os.system``,
    ``os.popen``, ``os.spawn*`` and ``os.posix_spawn*``, in a training script."""

    code = "MN203"
    name = "subprocess-under-mpi"
    summary = "starting a subprocess forks the MPI process"
    why = (
        "`subprocess` and `os.system` fork the calling process. Under Open MPI a fork after "
        "MPI_Init can corrupt registered memory; the job aborts (signal 6) or hangs. Run the "
        "command before MPI starts, from the launcher, or not at all."
    )
    bad = "subprocess.run(['nvidia-smi'])\n"
    good = "# run `nvidia-smi` from the job script, before mpiexec\n"

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.callee_names(node)
        if N.any_in(names, N.SUBPROCESS_CALLS):
            self.report(node, f"`{min(names & N.SUBPROCESS_CALLS)}` forks the MPI process")


class ForkUnderMpi(Rule):
    """Fires on ``os.fork()``, ``os.forkpty()`` and ``pty.fork()`` in a training script."""

    code = "MN204"
    name = "fork-under-mpi"
    summary = "os.fork() inside an MPI job"
    why = (
        "A forked child shares the parent's MPI and CUDA state; Open MPI warns, then the job "
        "aborts (signal 6), hangs, or silently corrupts data. CUDA contexts do not survive fork."
    )
    bad = "pid = os.fork()\n"
    good = "# use multiprocessing with the 'forkserver' start method, before the communicator\n"

    def visit_Call(self, node: cst.Call) -> None:
        if N.any_in(self.ctx.callee_names(node), N.FORK_CALLS):
            self.report(node)


class MultiprocessingForkStartMethod(Rule):
    """Fires on ``multiprocessing.set_start_method('fork')`` and
    ``multiprocessing.get_context('fork')``, and on ``multiprocessing.Process``/``Pool``/
    ``concurrent.futures.ProcessPoolExecutor`` constructions in a script that never selects the
    'forkserver' or 'spawn' start method with ``multiprocessing.set_start_method`` (on Linux the
    default start method is fork)."""

    code = "MN205"
    name = "multiprocessing-fork-start-method"
    summary = "multiprocessing uses the fork start method inside an MPI job"
    why = (
        "With the 'fork' start method every worker is a fork of the MPI (and CUDA) process: "
        "Open MPI aborts with signal 6 or the workers hang. 'forkserver' or 'spawn' start "
        "workers from a clean process."
    )
    bad = "pool = multiprocessing.Pool(4)\n"
    good = "multiprocessing.set_start_method('forkserver')\npool = multiprocessing.Pool(4)\n"

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._safe_method_set = False
        self._constructions: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.callee_names(node)
        if not names:
            return
        method = start_method(self.ctx, node)
        if method == "fork":
            self.report(node, "the 'fork' start method forks the MPI process")
        elif method in _SAFE_START_METHODS and N.any_in(names, N.START_METHOD_SETTERS):
            self._safe_method_set = True
        elif N.any_in(names, N.PROCESS_FACTORIES):
            self._constructions.append(node)

    def finish(self) -> None:
        if self._safe_method_set:
            return
        for node in self._constructions:
            self.report(
                node,
                "worker processes are forked (the default start method); "
                "call multiprocessing.set_start_method('forkserver') first",
            )
