"""MN104 ``implicit-device-without-selection``: allocated on the current device, but no rank ever
selects its GPU.

Its documentation (docs/rules.md, ``mnify explain MN104``) is generated from the rule class below.
Fixture: fixtures/lint/MN104.py.

Family: MN1xx: choosing the GPU. Each rank must select its node-local GPU once, before anything is
allocated on "the current device".
"""

from __future__ import annotations

import libcst as cst

from mnify.hazards.device_selection import implicit_placement, is_device_selection
from mnify.hazards.rule import AppliesTo, Rule
from mnify.program.context import LintContext


class ImplicitDeviceWithoutSelection(Rule):
    """Fires, in a distributed script that never selects a device (no selection as listed in
    MN101 anywhere in the file), on each allocation on the current device without a device
    argument: ``link.to_gpu()``, ``cuda.to_gpu(x)`` without a device, CuPy allocations."""

    code = "MN104"
    name = "implicit-device-without-selection"
    summary = "allocated on the current device, but no rank ever selects its GPU"
    why = (
        "Without a device selection the current device is GPU 0 on every rank: all ranks of a "
        "node share GPU 0 (out of memory, or N times slower) while the other GPUs idle. Select "
        "`comm.intra_rank` first, or pass it to `to_gpu`."
    )
    bad = "comm = chainermn.create_communicator()\nmodel.to_gpu()\n"
    good = (
        "comm = chainermn.create_communicator()\n"
        "chainer.backends.cuda.get_device_from_id(comm.intra_rank).use()\n"
        "model.to_gpu()\n"
    )
    applies_to = AppliesTo.DISTRIBUTED

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._placements: list[tuple[cst.Call, str]] = []
        self._selected = False

    def visit_Call(self, node: cst.Call) -> None:
        if is_device_selection(self.ctx, node):
            self._selected = True
            return
        what = implicit_placement(self.ctx, node)
        if what is not None:
            self._placements.append((node, what))

    def finish(self) -> None:
        if self._selected:
            return
        for node, what in self._placements:
            self.report(
                node,
                f"`{what}` allocates on GPU 0 on every rank: no device is ever selected; "
                "select comm.intra_rank first",
            )
