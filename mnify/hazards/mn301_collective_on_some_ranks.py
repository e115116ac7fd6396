"""MN301 ``collective-on-some-ranks``: collective reached on only some ranks: the others never join it
(deadlock).

Its documentation (docs/rules.md, ``mnify explain MN301``) is generated from the rule class below.
Fixture: fixtures/lint/MN301.py.

Family: MN3xx: collectives that not every rank reaches. A collective returns only when all ranks of
the communicator have called it; a rank that skips it leaves the others waiting forever (or, with
the watchdog on, until ``CollectiveTimeout``).
"""

from __future__ import annotations

import libcst as cst

from mnify.hazards.rule import AppliesTo, Rule
from mnify.program.context import LintContext

_OTHER_BRANCH = {"body": "orelse", "orelse": "body"}


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
