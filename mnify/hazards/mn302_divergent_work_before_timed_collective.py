"""MN302 ``divergent-work-before-timed-collective``: rank-divergent work reaches a timed collective
without a barrier.

Its documentation (docs/rules.md, ``mnify explain MN302``) is generated from the rule class below.
Fixture: fixtures/lint/MN302.py.

Family: MN3xx: collectives that not every rank reaches. A collective returns only when all ranks of
the communicator have called it; a rank that skips it leaves the others waiting forever (or, with
the watchdog on, until ``CollectiveTimeout``).
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Rule
from mnify.program.context import LintContext
from mnify.syntax import dotted_name

_LOGGER_NAMES = frozenset({"logger", "log", "LOGGER", "logging"})


class _Block:
    __slots__ = ("loop_depth", "loop_body", "pending", "first_collective")

    def __init__(self, loop_depth: int, loop_body: bool = False) -> None:
        self.loop_depth = loop_depth
        self.loop_body = loop_body  # the body of a for/while: it runs again after its end
        self.pending: cst.If | None = None
        self.first_collective: tuple[cst.Call, str] | None = None


class _RankIf:
    __slots__ = ("node", "work", "collective")

    def __init__(self, node: cst.If) -> None:
        self.node = node
        self.work = False
        self.collective = False


class _OutermostCalls(cst.CSTVisitor):
    """The calls of a body not nested in another call's arguments, and its loops."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[cst.Call] = []
        self.loops: list[cst.For | cst.While] = []
        self._depth = 0

    def visit_Call(self, node: cst.Call) -> None:
        if self._depth == 0:
            self.calls.append(node)
        self._depth += 1

    def leave_Call(self, original_node: cst.Call) -> None:
        self._depth -= 1

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.loops.append(node)


class DivergentWorkBeforeTimedCollective(Rule):
    """Fires, in a distributed script, on the first collective performed inside a loop (or on
    ``trainer.run()``) that follows, in the same block, a rank-conditional ``if`` doing work, with
    no ``barrier()`` or other collective between them at that block's level. Also when such an
    ``if`` is the last collective-free part of a loop body: then the first collective of the
    body (unless it is a barrier) fires, as the next iteration reaches it.

    "Doing work": the ``if`` (either branch) contains a loop (other than one that only prints or
    writes: its body is bookkeeping calls, plain assignments and such loops) or an outermost call (not one
    nested in another call's arguments) other than cheap bookkeeping (builtins such as
    ``print``/``len``, ``extend``/``append``/``format``/``write``/``flush``/``writerow``/``close``/logging methods,
    extension constructors, ``create_empty_dataset``, ``chainer.links`` constructors and classes
    defined in the file, ``os.path``/``os.makedirs``/``os.mkdir``, reading a clock (``time.time``, not ``time.sleep``), Chainer's configuration switches (``chainer.no_backprop_mode``, ``using_config``), and writing a file: ``open``, ``csv`` writers, ``np.save``,
    ``json``/``pickle`` dumps, ``savefig``, the serializers and building the computational graph to dump it, and calls of this file's functions made only of such bookkeeping — what rank 0 alone does as a
    matter of course), and contains
    no collective itself (those are MN301's business). ``rank >= 0``/``rank < 0`` tests are the
    same on every rank and never count."""

    code = "MN302"
    name = "divergent-work-before-timed-collective"
    summary = "rank-divergent work reaches a timed collective without a barrier"
    why = (
        "While one rank does extra work the others already wait inside the first collective of "
        "the training loop. With a watchdog (MNIFY_WATCHDOG_TIMEOUT, or nnabla's) that wait is "
        "timed, so a slow rank 0 makes the healthy ranks raise CollectiveTimeout. A "
        "`comm.barrier()` before the loop puts the wait where no timeout applies."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    prepare_cache(args.out)\n"
        "for batch in train_iter:\n"
        "    comm.all_reduce(grads)\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    prepare_cache(args.out)\n"
        "comm.barrier()\n"
        "for batch in train_iter:\n"
        "    comm.all_reduce(grads)\n"
    )
    applies_to = AppliesTo.DISTRIBUTED

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._blocks: list[_Block] = []
        self._rank_ifs: list[_RankIf] = []
        self._function_starts: list[int] = [0]  # blocks of enclosing functions do not count
        self._call_depth = 0  # only outermost calls count as work: extend(factory(...)) is cheap
        self._next_block_is_loop_body = False
        self._cheap_functions: set[str] = set()

    def visit_Module(self, node: cst.Module) -> None:
        self._blocks.append(_Block(self.ctx.loop_depth))
        self._cheap_functions = self._bookkeeping_functions(node)

    def _bookkeeping_functions(self, module: cst.Module) -> set[str]:
        """Module-level functions whose body is only cheap bookkeeping (a ``log_progress(step)``
        that appends a line to a file): calling one is no work either."""
        found: set[str] = set()
        for stmt in module.body:
            if isinstance(stmt, cst.FunctionDef):
                body = _OutermostCalls()
                stmt.body.visit(body)
                loops_work = not all(self._loop_is_bookkeeping(loop) for loop in body.loops)
                if not loops_work and not any(self._is_work(c) for c in body.calls):
                    found.add(stmt.name.value)
        return found

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.append(_Block(self.ctx.loop_depth, self._next_block_is_loop_body))
        self._next_block_is_loop_body = False

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        block = self._blocks.pop()
        first = block.first_collective
        if block.loop_body and block.pending is not None and first is not None:
            # the divergent `if` ends the body: the next iteration starts with a collective
            if first[1] not in N.BARRIER_METHODS:
                self.report(
                    first[0],
                    f"`{first[1]}` in the next iteration follows rank-divergent work (the rank "
                    "check at line {line}) without `comm.barrier()`: slow ranks trip the "
                    "collective watchdog",
                    related=block.pending,
                )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._function_starts.append(len(self._blocks))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._function_starts.pop()

    def visit_If(self, node: cst.If) -> None:
        if self.ctx.is_rank_if(node):
            self._rank_ifs.append(_RankIf(node))

    def leave_If(self, original_node: cst.If) -> None:
        if not self._rank_ifs or self._rank_ifs[-1].node is not original_node:
            return
        done = self._rank_ifs.pop()
        if self._rank_ifs:
            outer = self._rank_ifs[-1]
            outer.work |= done.work
            outer.collective |= done.collective
        elif done.work and not done.collective:
            self._blocks[-1].pending = done.node

    def visit_For(self, node: cst.For) -> None:
        if not self._loop_is_bookkeeping(node):
            self._mark_work()
        self._next_block_is_loop_body = True

    def visit_While(self, node: cst.While) -> None:
        if not self._loop_is_bookkeeping(node):
            self._mark_work()
        self._next_block_is_loop_body = True

    def _loop_is_bookkeeping(self, loop: cst.For | cst.While) -> bool:
        """A loop that prints or writes lines (``for k, v in stats.items(): print(k, v)``,
        a retry counter around a write): its header calls and every statement of its body are
        bookkeeping -- calls that are no work, assignments whose values call no work, ``pass``/
        ``break``/``continue``, loops like it -- and at least one statement is such a call. A
        loop that only computes (``for x in data: total += x``) is work."""
        header = _OutermostCalls()
        (loop.iter if isinstance(loop, cst.For) else loop.test).visit(header)
        if any(self._is_work(c) for c in header.calls) or loop.orelse is not None:
            return False
        if not isinstance(loop.body, cst.IndentedBlock):
            return False
        outputs = 0
        for stmt in loop.body.body:
            if isinstance(stmt, (cst.For, cst.While)):
                if not self._loop_is_bookkeeping(stmt):
                    return False
                outputs += 1
                continue
            if not isinstance(stmt, cst.SimpleStatementLine):
                return False
            for small in stmt.body:
                if isinstance(small, (cst.Pass, cst.Break, cst.Continue)):
                    continue
                if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    calls = [small.value]
                    outputs += 1
                elif isinstance(small, (cst.Assign, cst.AugAssign)):
                    found = _OutermostCalls()
                    small.value.visit(found)
                    calls = found.calls
                else:
                    return False
                if any(self._is_work(c) for c in calls):
                    return False
        return outputs > 0

    def visit_Call(self, node: cst.Call) -> None:
        self._call_depth += 1
        key = self.ctx.collective_key(node)
        if self._rank_ifs:
            if key is not None:
                self._rank_ifs[-1].collective = True
            elif self._call_depth == 1 and self._is_work(node):
                self._rank_ifs[-1].work = True
            return
        if key is None:
            return
        for block in self._blocks[self._function_starts[-1] :]:
            if block.first_collective is None:
                block.first_collective = (node, key)
            pending = block.pending
            if pending is None:
                continue
            block.pending = None
            timed = self.ctx.loop_depth > block.loop_depth or key == "trainer.run"
            if timed and key not in N.BARRIER_METHODS:
                self.report(
                    node,
                    f"`{key}` follows rank-divergent work (the rank check at line {{line}}) "
                    "without `comm.barrier()`: slow ranks trip the collective watchdog",
                    related=pending,
                )

    def leave_Call(self, original_node: cst.Call) -> None:
        self._call_depth -= 1

    def _mark_work(self) -> None:
        if self._rank_ifs:
            self._rank_ifs[-1].work = True

    def _is_work(self, call: cst.Call) -> bool:
        names = self.ctx.callee_names(call)
        for name in names:
            if (
                name in N.CHEAP_BUILTINS
                or N.is_extension(name)
                or name in N.EMPTY_DATASET_FACTORIES
                or N.is_link_name(name)
                or name.startswith(("logging.", "os.path.", "os.makedirs"))
                or N.is_file_writer(name)
                or name in N.OPEN_FUNCTIONS
                or name in N.ROW_WRITER_FACTORIES
                or name in N.GRAPH_DUMPERS
                or name in N.CLOCK_FUNCTIONS
                or name in N.CONFIG_SWITCHES
                or name in N.DIRECTORY_MAKERS
            ):
                return False
        func = call.func
        if isinstance(func, cst.Name) and func.value in self.ctx.class_names:
            return False  # building a model defined here: allocation, not a long task
        if isinstance(func, cst.Name) and func.value in self._cheap_functions:
            return False  # a function of this file that only does bookkeeping
        if isinstance(func, cst.Attribute):
            if func.attr.value in N.CHEAP_METHODS:
                return False
            receiver = dotted_name(func.value)
            if receiver is not None and receiver.split(".")[-1] in _LOGGER_NAMES:
                return False
        return True
