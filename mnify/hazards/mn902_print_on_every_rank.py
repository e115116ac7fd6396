"""MN902 ``print-on-every-rank``: print runs on every rank: N interleaved copies of each line.

Its documentation (docs/rules.md, ``mnify explain MN902``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``rank0-guard`` (mnify/rewrites/guards.py,
docs/converter.md). Fixture: fixtures/lint/MN902.py.

Family: MN9xx: information and preview rules, off by default (select them explicitly).
"""

from __future__ import annotations

import libcst as cst

from mnify.hazards.rule import AppliesTo, Rule


class PrintOnEveryRank(Rule):
    """Fires, in a distributed script, on ``print(...)`` calls that run on every rank (not
    inside a rank-conditional ``if``, not after a rank-conditional early exit) and whose
    arguments do not mention a rank."""

    code = "MN902"
    name = "print-on-every-rank"
    summary = "print runs on every rank: N interleaved copies of each line"
    why = (
        "Every rank prints the same line, so the job log holds N interleaved copies and real "
        "per-rank messages drown. Print on rank 0, or include the rank when the message is "
        "about one rank. Information only."
    )
    bad = (
        "comm = chainermn.create_communicator()\n"
        "print('epoch done')\n"
        "print('rank', comm.rank, 'ready')\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    print('epoch done')\n"
        "print('rank', comm.rank, 'ready')\n"
    )
    fixable = True
    default_enabled = False
    applies_to = AppliesTo.DISTRIBUTED

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if "builtins.print" not in ctx.callee_names(node) or ctx.on_some_ranks():
            return
        if any(ctx.find_rank(arg.value, ("global", "intra", "inter")) for arg in node.args):
            return
        self.report(node)
