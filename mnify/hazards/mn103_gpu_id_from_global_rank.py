"""MN103 ``gpu-id-from-global-rank``: GPU id taken from the global rank; use comm.intra_rank.

Its documentation (docs/rules.md, ``mnify explain MN103``) is generated from the rule class below;
``mnify convert`` fixes it in the step ``device`` (mnify/rewrites/device.py, docs/converter.md).
Fixture: fixtures/lint/MN103.py.

Family: MN1xx: choosing the GPU. Each rank must select its node-local GPU once, before anything is
allocated on "the current device".
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.rule import Rule
from mnify.program.context import LintContext
from mnify.syntax import argument

_DEVICE_KEYWORDS = ("device", "gpu", "device_id", "gpu_id")


_DEVICE_TARGET_SUFFIXES = ("gpu", "gpus", "device", "devices", "device_id", "gpu_id")


class GpuIdFromGlobalRank(Rule):
    """Fires on a global rank (``comm.rank``, ``comm.inter_rank``, ``MPI.COMM_WORLD.Get_rank()``,
    ``OMPI_COMM_WORLD_RANK``-style environment variables, or a variable assigned from one) used
    as a GPU id: inside the device argument of a device getter or ``setDevice``, of
    ``to_gpu``/``to_device``/``cuda.to_gpu``, in any ``device=``/``gpu=``/``device_id=``/
    ``gpu_id=`` keyword, or assigned to a name ending in ``gpu(s)``/``device(s)``/``device_id``/
    ``gpu_id``. ``comm.intra_rank`` (and ``*LOCAL_RANK`` variables) are correct and never fire."""

    code = "MN103"
    name = "gpu-id-from-global-rank"
    summary = "GPU id taken from the global rank; use comm.intra_rank"
    why = (
        "Ranks are numbered across all nodes but GPU ids restart at 0 on every node: with 2 nodes "
        "of 4 GPUs, rank 5 asks for GPU 5 and fails (`cudaErrorInvalidDevice`), or with "
        "round-robin placement several ranks share a GPU. `comm.intra_rank` is the rank within "
        "the node."
    )
    bad = "chainer.backends.cuda.get_device_from_id(comm.rank).use()\n"
    good = "chainer.backends.cuda.get_device_from_id(comm.intra_rank).use()\n"
    fixable = True

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        self._reported: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        names = self.ctx.callee_names(node)
        candidates: list[cst.BaseExpression | None] = []
        if N.any_in(names, N.DEVICE_GETTERS | N.DEVICE_SETTERS):
            candidates.append(argument(node, 0, "device_id", "device", "device_spec"))
        elif N.any_in(names, N.TO_GPU_FUNCTIONS):
            candidates.append(argument(node, 1, "device"))
        elif (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("to_gpu", "to_device")
            and not names
        ):
            candidates.append(argument(node, 0, "device"))
        candidates.extend(
            arg.value
            for arg in node.args
            if arg.keyword is not None and arg.keyword.value in _DEVICE_KEYWORDS
        )
        for expr in candidates:
            if expr is not None:
                self._check(expr)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            name = target.target
            last = name.attr.value if isinstance(name, cst.Attribute) else None
            if isinstance(name, cst.Name):
                last = name.value
            if last is not None and last.lower().endswith(_DEVICE_TARGET_SUFFIXES):
                self._check(node.value)

    def _check(self, expr: cst.BaseExpression) -> None:
        found = self.ctx.find_rank(expr, ("global", "inter"))
        if found is None or id(found) in self._reported:
            return
        if isinstance(found, cst.Name):
            bound = self.ctx.binding(found)
            if bound is not None and id(bound.value) in self._reported:
                return  # the assignment itself was already reported
        self._reported.add(id(found))
        self._reported.add(id(expr))
        self.report(found)
