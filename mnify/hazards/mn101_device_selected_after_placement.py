"""MN101 ``device-selected-after-placement``: device selected after arrays were already placed on a
GPU.

Its documentation (docs/rules.md, ``mnify explain MN101``) is generated from the rule class below.
Fixture: fixtures/lint/MN101.py.

Family: MN1xx: choosing the GPU. Each rank must select its node-local GPU once, before anything is
allocated on "the current device".
"""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.hazards.device_selection import implicit_placement, is_device_selection
from mnify.hazards.rule import Rule
from mnify.program.context import LintContext
from mnify.syntax import argument


def _code(expr: cst.CSTNode) -> str:
    """Source text of ``expr`` without whitespace, to compare device expressions."""
    return "".join(cst.Module([]).code_for_node(expr).split())


_CPU_DEVICES = ("'@numpy'", '"@numpy"', "-1", "'@intel64'", '"@intel64"')


def explicit_placement(ctx: LintContext, call: cst.Call) -> tuple[str, str] | None:
    """(description, device code) for ``x.to_gpu(d)``/``x.to_device(d)``/``cuda.to_gpu(x, d)``
    on a GPU device ``d``; None otherwise (CPU devices included)."""
    func = call.func
    device = None
    what = ""
    if N.any_in(ctx.callee_names(call), N.TO_GPU_FUNCTIONS):
        device, what = argument(call, 1, "device"), "cuda.to_gpu(...)"
    elif isinstance(func, cst.Attribute) and func.attr.value in ("to_gpu", "to_device"):
        device, what = argument(call, 0, "device"), f".{func.attr.value}(...)"
    if device is None:
        return None
    code = _code(device)
    return None if code in _CPU_DEVICES else (what, code)


def selection_devices(ctx: LintContext, call: cst.Call) -> set[str]:
    """Ways the selected device is written: the getter's argument and the device variable."""
    found: set[str] = set()
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "use":
        receiver = func.value
        getter: cst.BaseExpression | None = receiver
        if not isinstance(receiver, cst.Call):
            found.add(_code(receiver))
            bound = ctx.binding(receiver)
            getter = bound.value if bound is not None else None
        if isinstance(getter, cst.Call):
            device = argument(getter, 0, "device_id", "device", "device_spec")
            if device is not None:
                found.add(_code(device))
    else:
        device = argument(call, 0, "device")
        if device is not None:
            found.add(_code(device))
    return found


class DeviceSelectedAfterPlacement(Rule):
    """Fires on a device selection (``get_device_from_id(n).use()``, ``cuda.get_device(n).use()``,
    ``chainer.get_device(...).use()`` or ``device.use()`` on a bound device,
    ``cupy.cuda.Device(n).use()``, ``cupy.cuda.runtime.setDevice(n)``) when, earlier in the same
    function (or at module level), something was placed on a GPU that may not be the one
    selected: allocated on the current device without naming one (``link.to_gpu()`` or
    ``cuda.to_gpu(x)`` with no device, a CuPy allocation such as ``cupy.zeros`` or
    ``cuda.cupy.array``), or placed with ``to_gpu(d)``/``to_device(d)``/``cuda.to_gpu(x, d)`` on a
    device ``d`` written differently from the selected one. Placing on the device that is then
    selected (``model.to_device(device); device.use()``, Chainer's own example) and CPU
    placements (``'@numpy'``, ``-1``) do not count. Reported once per function."""

    code = "MN101"
    name = "device-selected-after-placement"
    summary = "device selected after arrays were already placed on a GPU"
    why = (
        "Until a device is selected the current device is GPU 0, so everything allocated before "
        "the selection lands on GPU 0 on every rank of the node (or on whatever GPU it was "
        "explicitly sent to): ranks crowd one GPU (out of memory), and mixing arrays from two "
        "devices fails inside CuPy kernels."
    )
    bad = "model.to_gpu()\nchainer.backends.cuda.get_device_from_id(comm.intra_rank).use()\n"
    good = "chainer.backends.cuda.get_device_from_id(comm.intra_rank).use()\nmodel.to_gpu()\n"

    def __init__(self, ctx: LintContext) -> None:
        super().__init__(ctx)
        # per function: placements so far, as (call, description, device code or None)
        self._placements: dict[int, list[tuple[cst.Call, str, str | None]]] = {}
        self._done: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        scope = id(self.ctx.scope_node)
        if scope in self._done:
            return
        if is_device_selection(self.ctx, node):
            selected = selection_devices(self.ctx, node)
            for placed, what, device in self._placements.get(scope, ()):
                if device is None or (selected and device not in selected):
                    where = "the current device (GPU 0)" if device is None else device
                    self._done.add(scope)
                    self.report(
                        node,
                        f"device selected after `{what}` at line {{line}} already placed arrays "
                        f"on {where}; select the device first",
                        related=placed,
                    )
                    return
            return
        implicit = implicit_placement(self.ctx, node)
        if implicit is not None:
            self._placements.setdefault(scope, []).append((node, implicit, None))
            return
        explicit = explicit_placement(self.ctx, node)
        if explicit is not None:
            self._placements.setdefault(scope, []).append((node, explicit[0], explicit[1]))
