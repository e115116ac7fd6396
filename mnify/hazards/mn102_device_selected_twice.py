"""MN102 ``device-selected-twice``: device selected more than once.

Its documentation (docs/rules.md, ``mnify explain MN102``) is generated from the rule class below.
Fixture: fixtures/lint/MN102.py.

Family: MN1xx: choosing the GPU. Each rank must select its node-local GPU once, before anything is
allocated on "the current device".
"""

from __future__ import annotations

import libcst as cst

from mnify.hazards.device_selection import is_device_selection
from mnify.hazards.rule import Rule
from mnify.program.context import LintContext


def _exclusive(a: tuple[tuple[int, str], ...], b: tuple[tuple[int, str], ...]) -> bool:
    """Two points in different branches of the same ``if`` never both run."""
    branches = dict(a)
    return any(branches.get(if_id, attr) != attr for if_id, attr in b)


class DeviceSelectedTwice(Rule):
    """Fires on the second and later device selections (see MN101 for what a selection is) in
    the same function (or at module level), unless the two sit in different branches of one
    ``if``/``else`` (mutually exclusive). ``with cupy.cuda.Device(n):`` blocks are scoped and not
    counted."""

    code = "MN102"
    name = "device-selected-twice"
    summary = "device selected more than once"
    why = (
        "The second selection silently moves every later allocation to another GPU while the "
        "model and optimizer state stay on the first: in a distributed script it usually undoes "
        "the per-rank `comm.intra_rank` choice, and the job fails with arrays on different "
        "devices or runs every rank on one GPU."
    )
    bad = (
        "chainer.backends.cuda.get_device_from_id(comm.intra_rank).use()\n"
        "chainer.backends.cuda.get_device_from_id(args.gpu).use()\n"
    )
    good = "chainer.backends.cuda.get_device_from_id(comm.intra_rank).use()\n"

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._selections: dict[int, list[tuple[cst.Call, tuple[tuple[int, str], ...]]]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        if not is_device_selection(self.ctx, node):
            return
        path = self.ctx.branch_path()
        earlier = self._selections.setdefault(id(self.ctx.scope_node), [])
        for previous, previous_path in earlier:
            if not _exclusive(previous_path, path):
                self.report(
                    node,
                    "device selected again (first selected at line {line}); select the device once",
                    related=previous,
                )
                break
        earlier.append((node, path))
