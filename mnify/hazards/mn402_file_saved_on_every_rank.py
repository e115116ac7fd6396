"""MN402 ``file-saved-on-every-rank``: every rank saves to the same file.

Its documentation (docs/rules.md, ``mnify explain MN402``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``rank0-guard`` (mnify/rewrites/guards.py,
docs/converter.md). Fixture: fixtures/lint/MN402.py.

Family: MN4xx: output (report extensions, saved files, prints) belongs on one rank.
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import AppliesTo, Finding, Rule
from mnify.syntax import argument, string_value


class FileSavedOnEveryRank(Rule):
    """Fires, in a distributed script, on a call that writes a file and runs on every rank (not
    inside a rank-conditional ``if``, not after a rank-conditional early exit) when the path it
    writes (its first argument or ``file=``) does not mention a rank, so every rank writes the
    same path: ``chainer.serializers.save_*``, ``np.save``/``savez``/``savetxt``,
    ``pickle.dump``/``json.dump`` (which write to a file object), ``savefig``, image writers
    (``cv2.imwrite``, ``imageio.imwrite``, ``PIL.Image...save``), ``shutil`` copies, and
    ``open(path, 'w'/'a'/'x')``. A write inside a function or method every call of which in the
    program runs on rank 0 only (standing alone under ``if <x>.rank == 0:``, or as the rank-0
    side of ``f(...) if <x>.rank == 0 else None``, the converter's broadcast of a writing
    helper's result) is rank 0's."""

    code = "MN402"
    name = "file-saved-on-every-rank"
    summary = "every rank saves to the same file"
    why = (
        "All ranks write the same path at the same time: on a shared file system the file ends "
        "up truncated or interleaved, and N-1 of the writes are wasted I/O. Save on rank 0, or "
        "put the rank in the file name when each rank really has its own state."
    )
    bad = (
        "comm = chainermn.create_communicator()\nchainer.serializers.save_npz('model.npz', model)\n"
    )
    good = (
        "comm = chainermn.create_communicator()\n"
        "if comm.rank == 0:\n"
        "    chainer.serializers.save_npz('model.npz', model)\n"
    )
    fixable = True
    applies_to = AppliesTo.DISTRIBUTED

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.on_some_ranks() or not self._writes(node):
            return
        target = argument(node, 0, "file")
        if target is not None and ctx.find_rank(target, ("global", "intra", "inter")):
            return
        self.report(node)

    def answered_elsewhere(self, finding: Finding, function: str | None) -> bool:
        """Not in a function or method the program calls on rank 0 only."""
        return function is not None and function in self.ctx.project.rank0_only_functions

    def _writes(self, node: cst.Call) -> bool:
        names = self.ctx.callee_names(node)
        if N.any_is(names, N.is_file_writer) and not N.any_in(names, N.DIRECTORY_MAKERS):
            return True
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in N.WRITER_METHODS:
            return True
        if N.any_in(names, N.OPEN_FUNCTIONS):
            mode = argument(node, 1, "mode")
            text = string_value(mode) if mode is not None else None
            return text is not None and any(flag in text for flag in N.WRITE_MODES)
        return False
