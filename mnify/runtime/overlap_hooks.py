"""The Chainer side of overlapped gradient averaging: when is a parameter's gradient final?

Chainer accumulates a parameter's gradient over its uses in a table local to backward and
writes it to ``param.grad`` only when the whole backward is over, so a function hook sees no
final gradient. Instead, for one update, each parameter gets a **gradient tap**: a function
node made the creator of the parameter's own variable node (the parameter stops being a leaf of
the graph for this step). Chainer runs a node's backward only after every function that
consumed its output -- every use of the parameter -- has been back-propagated, and hands it the
gradient summed over those uses: the tap's backward is exactly "the last use is done", and it
receives the final gradient. The tap stores it in ``param.grad`` as Chainer would have (added to
a gradient already there, the loss scale noted), tells the scheduler, and returns nothing.

Ranks: Chainer back-propagates functions in decreasing ``rank`` (generation). The tap is made
with rank -1, so the parameter's node keeps rank 0 and the forward assigns every function the
rank it would have had (backward's order, hence every sum, stays bit for bit as without taps).
After the forward a walk of the graph from the loss counts each parameter's uses and their
lowest rank; the tap gets that rank minus one, so it runs right after its parameter's last use
rather than at the very end. A parameter no function used (or none gave a gradient) never hears
from its tap: the scheduler zero-fills it at ``wait``.

How "last backward" is known: taps exist only inside the multi-node optimizer's
``update(lossfun)``, which runs the forward, clears the gradients, and runs exactly one
backward itself (as ``chainer.Optimizer.update`` does) -- so a gradient final in that backward
is final for the update, and only then (``armed``) do taps start reductions. Several
``backward()`` calls accumulated before a plain ``update()`` never see a tap: that path averages
after the fact, sequentially. A backward run inside the loss function (its gradients are
cleared before the update's own backward anyway) makes the step fall back to the sequential
path, as does any doubt: parameters created during the forward, parameters not yet initialised,
parameters on different kinds of device.

The first step of each parameter layout also learns the order: taps record the order gradients
become final, rank 0's order is broadcast, and buckets follow it from then on (DDP rebuilds its
buckets after the first iteration the same way); that step's buckets all start at ``wait``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import chainer

from mnify.runtime import observers
from mnify.runtime.communicators import _arrays as arr
from mnify.runtime.communicators.parameters import named_params
from mnify.runtime.debug import CallSignature
from mnify.runtime.overlap import BucketScheduler, OverlapChannel, wire_dtype


class GradTap(chainer.FunctionNode):
    """The creator of one parameter's node for one step; its backward is the parameter's last."""

    def __init__(self, step: OverlapStep, index: int, param: chainer.Parameter) -> None:
        self.step = step
        self.index = index
        self.param = param
        # an input that requires grad, or Chainer skips the node; it never receives one
        self._leaf = chainer.Variable(param.array, requires_grad=True)
        self.inputs = (self._leaf.node,)
        self.outputs = (weakref.ref(param.node),)  # type: ignore[assignment]
        self.rank = -1  # the parameter's node keeps rank 0: the forward's ranks are unchanged

    @property
    def label(self) -> str:
        return "GradTap"

    def backward(
        self, target_input_indexes: tuple[int, ...], grad_outputs: tuple[Any, ...]
    ) -> tuple[None, ...]:
        gy = grad_outputs[0]
        if gy is not None:
            self.step.final(self.index, self.param, gy)
        return (None,)


@dataclass
class OverlapStats:
    """What overlapped updates did (read by tests and the bench)."""

    steps: int = 0  # updates whose mean was overlapped
    fallbacks: int = 0  # updates that took the sequential path instead
    buckets: int = 0  # buckets per step in the current plan
    started_in_backward: int = 0  # buckets started before backward returned, all steps
    started_at_wait: int = 0  # buckets started after it (learning steps, unused params)
    uses: dict[str, int] = field(default_factory=dict)  # uses of each parameter, last step


class OverlapStep:
    """One update's taps: attached before the forward, armed for the update's own backward,
    detached after it."""

    def __init__(
        self,
        engine: OverlapEngine,
        names: list[str],
        params: list[Any],
        loss_scale: float | None,
        on_device: bool = False,
    ) -> None:
        self.engine = engine
        self.on_device = on_device  # gradients on the GPU (NCCL), else on the host (MPI)
        self.names = names
        self.params = params
        self.loss_scale = loss_scale
        self.taps = [GradTap(self, i, p) for i, p in enumerate(params)]
        self.armed = False
        self.saw_backward = False  # a backward ran before the update's own
        self.order: list[int] = []  # indexes in the order their gradients became final
        self.scheduler: BucketScheduler | None = None
        self.position: list[int] = []  # parameter index -> its place in the plan
        self.marks = (0, 0)  # the scheduler's started counts when backward began
        for tap, param in zip(self.taps, params, strict=True):
            param.node.set_creator_node(tap)

    def detach(self) -> None:
        """Make the parameters leaves again (idempotent)."""
        for param in self.params:
            if isinstance(param.node.creator_node, GradTap):
                param.node.unchain()
        self.armed = False

    def final(self, index: int, param: chainer.Parameter, gy: chainer.Variable) -> None:
        """Called by a tap: ``gy`` is the parameter's gradient summed over all its uses."""
        current: Any = param.grad_var
        param.grad_var = gy if current is None else current + gy
        param._loss_scale = self.loss_scale
        if not self.armed:
            self.saw_backward = True
            return
        self.order.append(index)
        if self.scheduler is not None:
            self.scheduler.ready(self.position[index], param.grad)

    def arm(self, loss: chainer.Variable) -> None:
        """Before the update's own backward: tap ranks from the graph, start listening."""
        lowest = count_uses(loss, {id(p.node): i for i, p in enumerate(self.params)}, self.taps)
        self.engine.stats.uses = {self.names[i]: n for i, (_, n) in lowest.items()}
        for i, (rank, _) in lowest.items():
            self.taps[i].rank = max(rank - 1, -1)
        self.order = []
        sched = self.scheduler
        self.marks = (sched.started_early, sched.started_late) if sched is not None else (0, 0)
        self.armed = True

    def fill(self, position: int) -> Any:
        """The gradient of the plan's array ``position`` for ``wait``: zeros if it has none."""
        param: Any = self.params[self.engine.order[position]]
        if param.grad is None:
            param.grad = arr.zeros_like(param.array)
        return param.grad


def count_uses(
    loss: chainer.Variable, tapped: dict[int, int], taps: list[GradTap]
) -> dict[int, tuple[int, int]]:
    """Walk the graph from ``loss``: for each tapped parameter node (``id`` -> index), the
    lowest rank of a function using it and how many uses it has."""
    found: dict[int, tuple[int, int]] = {}
    tap_ids = {id(t) for t in taps}
    seen: set[int] = set()
    stack = [loss.creator_node]
    while stack:
        func = stack.pop()
        if func is None or id(func) in seen or id(func) in tap_ids:
            continue
        seen.add(id(func))
        for node in func.inputs:
            index = tapped.get(id(node))
            if index is not None:
                rank, uses = found.get(index, (func.rank, 0))
                found[index] = (min(rank, func.rank), uses + 1)
            else:
                stack.append(node.creator_node)
    return found


class OverlapEngine:
    """Per multi-node optimizer: the channel, the current plan and its scheduler."""

    def __init__(self, communicator: Any) -> None:
        self.comm = communicator
        self.channels: dict[bool, OverlapChannel] = {}
        self.layout: tuple[Any, ...] | None = None
        self.order: list[int] = []  # plan position -> parameter index (sorted-name order)
        self.scheduler: BucketScheduler | None = None
        self.stats = OverlapStats()

    def _device_kind(self, params: list[chainer.Parameter]) -> bool | None:
        """True: all on a GPU the communicator drives with NCCL; False: all numpy; None: neither."""
        kinds = {arr.is_cupy(p.array) for p in params}
        if kinds == {False}:
            return False
        if kinds == {True} and getattr(self.comm, "name", "") == "pure_nccl":
            return True
        return None

    def begin(self, target: chainer.Link, loss_scale: float | None) -> OverlapStep | None:
        """Taps on every parameter of ``target``, or None when this step cannot overlap."""
        named = named_params(target)
        if not named or any(p.array is None for _, p in named):
            return None
        params = [p for _, p in named]
        kind = self._device_kind(params)
        if kind is None:
            return None
        layout = (kind, tuple((n, tuple(p.array.shape), p.array.dtype.str) for n, p in named))
        if layout != self.layout:
            self.layout, self.scheduler, self.order = layout, None, []
        step = OverlapStep(self, [n for n, _ in named], params, loss_scale, kind)
        if self.scheduler is not None:
            step.scheduler = self.scheduler
            step.position = [0] * len(params)
            for position, index in enumerate(self.order):
                step.position[index] = position
        return step

    def channel(self, on_device: bool) -> OverlapChannel:
        found = self.channels.get(on_device)
        if found is None:
            found = self.channels[on_device] = OverlapChannel(self.comm, on_device)
        return found

    def enter(self, step: OverlapStep) -> None:
        """Count the overlapped mean as the communicator's collective (before any bucket
        starts: ``MNIFY_DEBUG`` compares names and shapes across ranks here)."""
        enter = getattr(self.comm, "_enter", None)
        if enter is None:
            return
        if getattr(self.comm, "_debug", False):
            arrays = [p.array for p in step.params]
            enter(CallSignature.of("multi_node_mean_grad", arrays, names=step.names))
        else:
            enter(CallSignature("multi_node_mean_grad"))

    def wait(self, step: OverlapStep) -> None:
        """After the update's backward: plan if this was a learning step, then complete."""
        on_device = step.on_device
        if self.scheduler is None:
            channel = self.channel(on_device)
            seen = list(dict.fromkeys(step.order))
            rest = [i for i in reversed(range(len(step.params))) if i not in set(seen)]
            self.order = channel.bcast_obj(seen + rest)
            wire = wire_dtype(self.comm, [p.array.dtype for p in step.params], on_device)
            reducer = channel.reducer(wire)
            self.scheduler = BucketScheduler(
                [int(step.params[i].array.size) for i in self.order],
                reducer,
                channel.bucket_bytes(),
            )
            step.scheduler = self.scheduler
        scheduler = self.scheduler
        early_before, late_before = step.marks
        dog = getattr(self.comm, "_watchdog", None)
        if dog is not None:  # the deadline starts now, not when the buckets did
            dog.start("multi_node_mean_grad", int(getattr(self.comm, "_seq", 0)))
        scheduler.wait(step.fill)
        observers.overlap_buckets_done()  # for the timeline: every started bucket is done
        self.stats.steps += 1
        self.stats.buckets = len(scheduler.buckets)
        self.stats.started_in_backward += scheduler.started_early - early_before
        self.stats.started_at_wait += scheduler.started_late - late_before

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()
