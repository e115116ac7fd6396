"""MN3xx: collectives that not every rank reaches. A collective returns only when all ranks of
the communicator have called it; a rank that skips it leaves the others waiting forever (or, with
the watchdog on, until ``CollectiveTimeout``)."""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.lint.context import LintContext
from mnify.lint.rule import AppliesTo, Rule
from mnify.syntax import dotted_name

_OTHER_BRANCH = {"body": "orelse", "orelse": "body"}
_LOGGER_NAMES = frozenset({"logger", "log", "LOGGER", "logging"})


class CollectiveOnSomeRanks(Rule):
    """Fires on a collective call that only some ranks reach, in a distributed script.

    Collectives: communicator methods ``barrier``, ``bcast``/``bcast_obj``/``bcast_data``,
    ``gather*``, ``allgather*``, ``allreduce*``/``all_reduce``, ``alltoall``, ``scatter*``,
    ``reduce*``, ``multi_node_mean_grad`` and ``split`` (ChainerMN, mnify.runtime and mpi4py
    spellings) on a communicator; ``scatter_dataset``/``scatter_index``;
    ``create_communicator``; ``update()`` of a multi-node optimizer; calling or ``evaluate()``-ing
    a multi-node evaluator or passing one to ``trainer.extend``; ``trainer.run()``.
    "Only some ranks reach it" means either (a) it sits inside a branch of an ``if`` whose test
    mentions a rank (``comm.rank``, ``comm.intra_rank``, ``Get_rank()``, a variable assigned
    from one) and the other branch of that ``if`` does not call the same collective (so the
    ``if comm.rank == 0: x = comm.bcast_obj(v) else: x = comm.bcast_obj(None)`` idiom is fine),
    or (b) it follows, in the same function or loop, a ``return``/``continue``/``break``/
    ``sys.exit()`` taken inside such a rank-conditional branch. A call of a function defined in
    the same file (``helper(...)``, ``self.helper(...)``) counts as the collectives that
    function performs, directly or through other local functions. Collectives on a
    communicator assigned from ``comm.split(...)`` (mpi4py: ``Split``, ``Split_type``,
    ``Create``, ``Create_group``) never fire: such a communicator usually holds exactly the
    ranks that take the branch."""

    code = "MN301"
    name = "collective-on-some-ranks"
    summary = "collective reached on only some ranks: the others never join it (deadlock)"
    why = (
        "Every rank must enter a collective for any rank to leave it. Inside `if comm.rank == 0:` "
        "rank 0 waits for ranks that never come: the job hangs without an error (or, with "
        "MNIFY_WATCHDOG_TIMEOUT set, dies with CollectiveTimeout naming the missing ranks)."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    comm.barrier()\n"
        "    print('saved')\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "comm.barrier()\n"
        "if comm.rank == 0:\n"
        "    print('saved')\n"
    )
    applies_to = AppliesTo.DISTRIBUTED

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        # (call, key, enclosing rank branches, related node for an early exit, exit word)
        self._candidates: list[
            tuple[cst.Call, str, tuple[tuple[cst.If, str], ...], cst.CSTNode | None, str]
        ] = []
        self._seen: dict[tuple[int, str], set[str]] = {}
        self._functions: list[str] = []
        self._direct: dict[str, str] = {}  # function name -> a collective it performs
        self._calls: dict[str, set[str]] = {}  # function name -> local functions it calls
        self._top_level: set[str] = set()  # functions defined at module level
        self._class_depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not self._functions and not self._class_depth:
            self._top_level.add(node.name.value)
        self._functions.append(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._class_depth += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._class_depth -= 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()

    def module_functions_with_collectives(self) -> dict[str, str]:
        """Module-level functions of this file that perform a collective (directly, through
        local functions, or through ``ctx.external_collectives``), for other files' checks."""
        performs = self._collective_functions()
        return {name: what for name, what in performs.items() if name in self._top_level}

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        key = ctx.collective_key(node)
        if key is not None and isinstance(node.func, cst.Attribute):
            if ctx.is_sub_communicator(node.func.value):
                return  # a split communicator holds just the ranks that take such branches
        if key is None:
            key = ctx.external_collective(node)
        callee = None if key is not None else _local_callee(node)
        if key is None and callee is None:
            return
        if self._functions:
            current = self._functions[-1]
            if key is not None:
                self._direct.setdefault(current, key)
            elif callee is not None:
                self._calls.setdefault(current, set()).add(callee)
        effective = key if key is not None else f"{callee}()"
        branches = tuple(ctx.rank_branches[ctx.function_frame.rank_depth :])
        for if_node, attr in branches:
            self._seen.setdefault((id(if_node), attr), set()).add(effective)
        if branches:
            self._candidates.append((node, effective, branches, None, ""))
            return
        exit_frame = ctx.divergent_exit()
        if exit_frame is not None and exit_frame.exit_if is not None:
            word = _exit_word(exit_frame.exit_node)
            self._candidates.append((node, effective, (), exit_frame.exit_if, word))

    def finish(self) -> None:
        performs = self._collective_functions()
        for node, key, branches, exit_if, word in self._candidates:
            what = f"`{key}`"
            if key.endswith("()"):
                inner = performs.get(key[:-2])
                if inner is None:
                    continue  # a local function without collectives
                what = f"`{key}` (which calls `{inner}`)"
            if exit_if is not None:
                self.report(
                    node,
                    f"{what} is reached only by the ranks that did not `{word}` under the rank "
                    "check at line {line}: the others never join it (deadlock)",
                    related=exit_if,
                )
                continue
            unbalanced = [
                if_node
                for if_node, attr in branches
                if key not in self._seen.get((id(if_node), _OTHER_BRANCH[attr]), set())
            ]
            if unbalanced:
                self.report(
                    node,
                    f"{what} runs only on the ranks that take the rank check at line {{line}}; "
                    "the other ranks never join it (deadlock)",
                    related=unbalanced[-1],
                )

    def _collective_functions(self) -> dict[str, str]:
        """Functions of this file that perform a collective, directly or through other local
        functions (transitively), mapped to one collective they perform."""
        performs = dict(self._direct)
        changed = True
        while changed:
            changed = False
            for function, callees in self._calls.items():
                if function in performs:
                    continue
                for callee in sorted(callees):
                    if callee in performs:
                        performs[function] = performs[callee]
                        changed = True
                        break
        return performs


def _local_callee(call: cst.Call) -> str | None:
    """``helper(...)`` or ``self.helper(...)``: a call that may reach a function of this file."""
    func = call.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        if func.value.value in ("self", "cls"):
            return func.attr.value
    return None


def _exit_word(node: cst.CSTNode | None) -> str:
    if isinstance(node, cst.Continue):
        return "continue"
    if isinstance(node, cst.Break):
        return "break"
    if isinstance(node, cst.Return):
        return "return"
    return "exit"


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
