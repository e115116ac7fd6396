"""MN903 ``stdin-read-on-every-rank``: standard input is read on every rank, but only rank 0 has
it.

Its documentation (docs/rules.md, ``mnify explain MN903``) is generated from the rule class below.
``mnify convert`` does not fix it: where the answer goes is the script's choice. Fixture:
fixtures/lint/MN903.py.

Family: MN9xx: information and preview rules, off by default (select them explicitly). A preview
rule, like ruff's: it can be promoted to a default family once it has run over real scripts.
"""

from __future__ import annotations

import libcst as cst

from mnify.hazards.rule import AppliesTo, Rule

# what reads the process's standard input (qualified names, as lint resolves callees)
STDIN_READERS = frozenset(
    {"builtins.input", "sys.stdin.read", "sys.stdin.readline", "sys.stdin.readlines"}
)


class StdinReadOnEveryRank(Rule):
    """Fires, in a distributed script, on each call of ``input()``, ``sys.stdin.read()``,
    ``sys.stdin.readline()`` or ``sys.stdin.readlines()`` that runs on every rank (not inside a
    rank-conditional ``if``, not after a rank-conditional early exit)."""

    code = "MN903"
    name = "stdin-read-on-every-rank"
    summary = "standard input is read on every rank, but mpiexec gives it to rank 0 only"
    why = (
        "mpiexec forwards the terminal's (or the pipe's) standard input to rank 0 alone; the "
        "other ranks read an empty stream, so input() raises EOFError there and the job aborts, "
        "or a read returns '' and the ranks go on with different answers. Read on rank 0 and "
        "hand the answer to every rank (comm.bcast_obj)."
    )
    bad = "comm = chainermn.create_communicator()\nanswer = input('continue? ')\n"
    good = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    answer = input('continue? ')\n"
        "else:\n"
        "    answer = None\n"
        "answer = comm.bcast_obj(answer)\n"
    )
    default_enabled = False
    applies_to = AppliesTo.DISTRIBUTED

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.callee_names(node) & STDIN_READERS and not ctx.on_some_ranks():
            self.report(node)
