"""MN1xx: choosing the GPU. Each rank must select its node-local GPU once, before anything is
allocated on "the current device"."""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.lint.context import LintContext
from mnify.lint.rule import AppliesTo, Rule
from mnify.syntax import argument

_DEVICE_KEYWORDS = ("device", "gpu", "device_id", "gpu_id")
_DEVICE_TARGET_SUFFIXES = ("gpu", "gpus", "device", "devices", "device_id", "gpu_id")


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


def _exclusive(a: tuple[tuple[int, str], ...], b: tuple[tuple[int, str], ...]) -> bool:
    """Two points in different branches of the same ``if`` never both run."""
    branches = dict(a)
    return any(branches.get(if_id, attr) != attr for if_id, attr in b)


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
