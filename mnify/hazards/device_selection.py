"""Shared by the MN1xx device rules: what selects a GPU and what allocates on the current device."""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.program.context import LintContext
from mnify.syntax import argument


def is_device_selection(ctx: LintContext, call: cst.Call) -> bool:
    """``<device getter>(...).use()``, ``device.use()`` on a bound device, or ``setDevice(n)``."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "use":
        receiver = func.value
        if isinstance(receiver, cst.Call):
            return N.any_in(ctx.callee_names(receiver), N.DEVICE_GETTERS)
        return ctx.binding_kind(receiver) == "device"
    return N.any_in(ctx.callee_names(call), N.DEVICE_SETTERS)


def implicit_placement(ctx: LintContext, call: cst.Call) -> str | None:
    """A description of ``call`` when it allocates on whatever device is current, else None:
    ``x.to_gpu()`` without a device, ``cuda.to_gpu(x)`` without a device, any CuPy allocation."""
    names = ctx.callee_names(call)
    if N.any_in(names, N.TO_GPU_FUNCTIONS):
        return None if argument(call, 1, "device") is not None else "cuda.to_gpu(...)"
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "to_gpu" and not names:
        return None if argument(call, 0, "device") is not None else ".to_gpu()"
    for name in names:
        if N.is_cupy_allocation(name):
            return name
    return None
