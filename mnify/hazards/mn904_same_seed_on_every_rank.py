"""MN904 ``same-seed-on-every-rank``: a data-parallel script seeds the global random generator
with the same value on every rank.

Its documentation (docs/rules.md, ``mnify explain MN904``) is generated from the rule class below.
``mnify convert`` does not fix it: shifting every seed by the rank would also change arrays a
script builds alike on every rank on purpose (a fixed noise sample it plots, a fixed split), so
which seed to shift is the script's choice. Fixture: fixtures/lint/MN904.py.

Family: MN9xx: information and preview rules, off by default (select them explicitly). A preview
rule, like ruff's: it can be promoted to a default family once it has run over real scripts.
"""

from __future__ import annotations

import libcst as cst

from mnify.hazards.rule import AppliesTo, Rule

# what seeds a process-wide random generator (qualified names, as lint resolves callees)
GLOBAL_SEEDERS = frozenset({"numpy.random.seed", "random.seed", "cupy.random.seed"})
_RANK_KINDS = ("global", "intra", "inter")


class SameSeedOnEveryRank(Rule):
    """Fires, in a data-parallel script, on each call of ``numpy.random.seed``, ``random.seed``
    or ``cupy.random.seed`` that runs on every rank (not inside a rank-conditional ``if``, not
    after a rank-conditional early exit) with a seed that does not use the rank (``comm.rank``,
    ``comm.intra_rank``, a name bound to one, an MPI rank variable). A call without a seed is
    left alone: it seeds from the operating system, differently on each rank."""

    code = "MN904"
    name = "same-seed-on-every-rank"
    summary = (
        "the global random generator gets the same seed on every rank: their random draws repeat"
    )
    why = (
        "Each rank then draws the same random numbers: dropout masks, data augmentation and any "
        "input the script samples itself (a GAN's noise, negative samples) repeat across ranks, "
        "so N ranks train on N copies of one random batch instead of N batches and the run is "
        "not the one-process run with an N times larger batch. `mnify run --verify` reports it "
        "as same-data when it reaches the gradients. Parameters need no common seed: the "
        "multi-node optimizer broadcasts rank 0's at setup. Add the rank to the seed."
    )
    bad = (
        "import numpy as np\n\n"
        "comm = chainermn.create_communicator()\n"
        "np.random.seed(args.seed)\n"
        "z = np.random.normal(size=(batchsize, 128))\n"
    )
    good = (
        "import numpy as np\n\n"
        "comm = chainermn.create_communicator()\n"
        "np.random.seed(args.seed + comm.rank)\n"
        "z = np.random.normal(size=(batchsize, 128))\n"
    )
    default_enabled = False
    applies_to = AppliesTo.DATA_PARALLEL

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if not node.args or not ctx.callee_names(node) & GLOBAL_SEEDERS or ctx.on_some_ranks():
            return
        if any(ctx.find_rank(arg.value, _RANK_KINDS) is not None for arg in node.args):
            return
        self.report(node)
