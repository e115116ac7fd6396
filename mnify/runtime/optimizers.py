"""The multi-node optimizer: wrap a Chainer optimizer so every rank takes the same step.

``create_multi_node_optimizer(opt, comm)`` returns a wrapper that behaves like ``opt`` (every
attribute it does not own, read or written, is the wrapped optimizer's) but

* on its first update, and whenever the set or shapes of the model's parameters change (a lazily
  initialised ``L.Linear(None, n)`` gets its weights at the first forward), broadcasts rank 0's
  parameters to every rank, so ranks that started from different random initialisations agree;
* on every other update, averages the gradients over the ranks
  (``comm.multi_node_mean_grad``) before the wrapped optimizer applies them.

Gradient semantics: each rank's gradient is that of its own loss (normally the mean over its own
batch) and the ranks' gradients are averaged with equal weight. With equal per-rank batches
(ChainerMN's weak scaling) this is exactly the gradient of the mean loss over the global batch.
With uneven batches each rank's examples weigh ``1 / (size * local_batch)``; scale the local loss
by ``local_batch * size / global_batch`` to weight every example equally.

With a global-batch iterator (:mod:`mnify.runtime.iterators.global_batch_iterator`) the shares
are known: ``update(lossfun)`` multiplies this rank's loss by ``size * n_r / N`` before backward
(``n_r`` its share of the step, ``N`` the global batch), so any split -- uneven, by speed, a rank
with no examples -- gives one process's mean gradient, through MultiNodeBatchNormalization too
(its backward sums the ranks' contributions of the scaled losses). ``update()`` without a loss
function scales the gradients before the mean instead, which is exact except through
MultiNodeBatchNormalization (the other ranks' unscaled contributions are already in them). A rank
with an empty share still runs the loss function and every collective, contributes zero
gradient, and reports nothing (its observations go to a scope that is dropped), so its empty
loss and accuracy do not enter reported means. Exact only for losses that are means over the
batch; dropout and augmentation draw per rank (docs/global_batch.md).

ChainerMN's first update only broadcasts, so the first batch is lost. Here ``setup(model)``
broadcasts at once when every parameter has its shape, so a hand-written loop's first
``loss.backward(); optimizer.update()`` is a real step on parameters every rank shares. When
``update`` is given a loss function (as ``StandardUpdater`` does), parameters that are still
lazy are created by a forward run in Chainer's ``in_recomputing`` mode (no gradients, batch-norm
statistics untouched) and broadcast before the step. No batch is lost. Only ``update()``
without a loss function on a model whose lazy parameters appeared in the caller's forward
(gradients computed on parameters that were not yet in sync) still skips that one step.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import chainer

from mnify import environment
from mnify.runtime import observers
from mnify.runtime.iterators import global_step
from mnify.runtime.overlap_hooks import OverlapEngine, OverlapStats

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

ParamSignature = tuple[tuple[str, tuple[int, ...] | None], ...]


def param_signature(target: chainer.Link) -> ParamSignature:
    """Names and shapes (None while uninitialised) of ``target``'s parameters, sorted by name.

    A change means the ranks may disagree on parameters that the last broadcast did not cover.
    """
    return tuple(
        (name, None if param.array is None else tuple(param.array.shape))
        for name, param in sorted(target.namedparams())
    )


@contextlib.contextmanager
def _reports_dropped() -> Iterator[None]:
    """What the block reports to the current reporter (if any) is dropped: a rank's loss and
    accuracy over zero examples must not enter the reported means."""
    try:
        reporter = chainer.reporter.get_current_reporter()
    except IndexError:  # no reporter: reports go nowhere anyway
        yield
        return
    kept = reporter.observation
    reporter.observation = {}
    try:
        yield
    finally:
        reporter.observation = kept


class _WrapperBase:
    """Attribute pass-through shared by both optimizer wrappers.

    The wrapper's own state lives in ``__dict__`` (set with ``object.__setattr__``); any other
    attribute, read or written, is the wrapped optimizer's, so ``opt.lr = 0.1``, ``opt.add_hook``,
    ``opt.target`` and ``opt.serialize`` work as on the plain optimizer.
    """

    actual_optimizer: chainer.Optimizer
    communicator: CommunicatorBase
    zero_fill: bool

    def __init__(
        self, actual_optimizer: chainer.Optimizer, communicator: CommunicatorBase, zero_fill: bool
    ) -> None:
        object.__setattr__(self, "actual_optimizer", actual_optimizer)
        object.__setattr__(self, "communicator", communicator)
        object.__setattr__(self, "zero_fill", zero_fill)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: PLE0307 -- the point: report the wrapped class
        """The wrapped optimizer's class, so that ``isinstance(opt, chainer.optimizers.Adam)``
        holds and code dispatching on ``opt.__class__`` (``functools.singledispatch``) takes the
        user's optimizer's branch. ``type(opt)`` still names the wrapper."""
        actual = self.__dict__.get("actual_optimizer")
        return type(self) if actual is None else type(actual)

    @property
    def _target(self) -> Any:
        """The model the wrapped optimizer was set up with."""
        return self.actual_optimizer.target

    def _set_own(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def setup(self, link: chainer.Link) -> _WrapperBase:
        """Set up the wrapped optimizer on ``link``; returns the wrapper, as ChainerMN does."""
        self.actual_optimizer.setup(link)
        return self

    def __getattr__(self, name: str) -> Any:
        # Only called for names not found on the wrapper itself.
        if name == "actual_optimizer":  # during unpickling/copy, before __init__ ran
            raise AttributeError(name)
        return getattr(self.actual_optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.actual_optimizer, name, value)

    def _step(self) -> global_step.GlobalStep | None:
        """The global-batch step this update trains on (None: not a global-batch iterator's)."""
        comm = self.communicator
        return global_step.latest(comm.size, comm.rank)

    def _forward(self, lossfun: Any, args: tuple[Any, ...], kwds: dict[str, Any]) -> Any:
        """``lossfun``'s loss, weighted by this rank's share of a global batch (if any); a rank
        with an empty share reports nothing from it."""
        step = self._step()
        if step is None:
            return lossfun(*args, **kwds)
        if step.share == 0:
            with _reports_dropped():
                loss = lossfun(*args, **kwds)
        else:
            loss = lossfun(*args, **kwds)
        weight = step.loss_weight
        return loss if weight == 1.0 else loss * weight

    def _weight_grads(self) -> None:
        """``update()`` without a loss function: scale this rank's gradients by its share."""
        step = self._step()
        if step is None or step.loss_weight == 1.0:
            return
        weight = step.loss_weight
        for _, param in self._target.namedparams():
            if param.grad is not None:
                param.grad *= weight

    def _compute_grads(self, lossfun: Any, args: tuple[Any, ...], kwds: dict[str, Any]) -> None:
        """Forward and backward of ``lossfun`` the way ``Optimizer.update`` does it."""
        target = self._target
        loss = self._forward(lossfun, args, kwds)
        if getattr(self.actual_optimizer, "_use_cleargrads", True):
            target.cleargrads()
        else:
            target.zerograds()
        loss.backward(loss_scale=self.actual_optimizer._loss_scale)
        del loss


class MultiNodeOptimizer(_WrapperBase):
    """Broadcast on parameter changes, otherwise average gradients, then the wrapped update.

    ``overlap``: in ``update(lossfun)``, average each bucket of gradients as soon as backward
    has finished its gradients (:mod:`mnify.runtime.overlap_hooks`), instead of after backward.
    """

    def __init__(
        self,
        actual_optimizer: chainer.Optimizer,
        communicator: CommunicatorBase,
        zero_fill: bool,
        overlap: bool = False,
    ) -> None:
        super().__init__(actual_optimizer, communicator, zero_fill)
        self._set_own("synced_signature", None)
        self._set_own("overlap", bool(overlap))
        self._set_own("_overlap_engine", OverlapEngine(communicator) if overlap else None)

    def setup(self, link: chainer.Link) -> MultiNodeOptimizer:
        """Set up the wrapped optimizer on ``link`` and, when every parameter already has its
        shape, broadcast rank 0's parameters now (collective: every rank sets up), so that the
        first ``update()`` of a hand-written loop is a real step, not only a broadcast."""
        self.actual_optimizer.setup(link)
        if all(shape is not None for _, shape in param_signature(link)):
            self._broadcast_if_changed()
        return self

    @property
    def overlap_stats(self) -> OverlapStats | None:
        """What the overlapped updates did (None when overlap is off)."""
        engine = self._overlap_engine
        return None if engine is None else engine.stats

    def _broadcast_if_changed(self) -> bool:
        """Broadcast rank 0's parameters if the parameter set changed since the last broadcast."""
        target = self._target
        signature = param_signature(target)
        if signature == self.synced_signature:
            return False
        self.communicator.bcast_data(target)
        self._set_own("synced_signature", signature)
        return True

    def mark_synchronized(self) -> None:
        """Declare the ranks' parameters equal (all loaded the same checkpoint): no broadcast."""
        self._set_own("synced_signature", param_signature(self._target))

    def update(self, lossfun: Any = None, *args: Any, **kwds: Any) -> None:
        """One synchronous step; see the module docstring for what happens on the first one."""
        observers.update_begins(self)
        if lossfun is None:
            # The caller computed gradients. If parameters changed they were computed on
            # parameters the ranks did not share: broadcast and skip (ChainerMN's behaviour).
            if self._broadcast_if_changed():
                observers.update_ends(self)
                return
            self._weight_grads()
        else:
            signature = param_signature(self._target)
            if signature != self.synced_signature and any(s is None for _, s in signature):
                # Let a forward create the lazy parameters, so that they are broadcast before
                # the step. ``in_recomputing`` keeps batch norm's running statistics out of it.
                # (Only when parameters changed: a lazy link that stays unused costs nothing.)
                with chainer.using_config("in_recomputing", True), chainer.no_backprop_mode():
                    lossfun(*args, **kwds)
            self._broadcast_if_changed()
            if self._overlapped_step(lossfun, args, kwds):
                observers.apply_begins(self)
                self.actual_optimizer.update(None)
                observers.update_ends(self)
                return
            self._compute_grads(lossfun, args, kwds)
            if self._broadcast_if_changed():  # the forward still created parameters: redo it
                self._compute_grads(lossfun, args, kwds)
        self.communicator.multi_node_mean_grad(self._target, self.zero_fill)
        observers.apply_begins(self)
        self.actual_optimizer.update(None)
        observers.update_ends(self)

    def _overlapped_step(self, lossfun: Any, args: tuple[Any, ...], kwds: dict[str, Any]) -> bool:
        """Forward, backward and the gradient mean overlapped with that backward; False (nothing
        done) when this step takes the sequential path. See :mod:`mnify.runtime.overlap_hooks`
        for when it does."""
        engine = self._overlap_engine
        if engine is None or not self.zero_fill:
            return False
        target = self._target
        if param_signature(target) != self.synced_signature:
            return False
        opt = self.actual_optimizer
        step = engine.begin(target, opt._loss_scale)
        if step is None:
            engine.stats.fallbacks += 1
            return False
        try:
            loss = self._forward(lossfun, args, kwds)
        except BaseException:
            step.detach()
            raise
        if getattr(opt, "_use_cleargrads", True):
            target.cleargrads()
        else:
            target.zerograds()
        if step.saw_backward or param_signature(target) != self.synced_signature:
            # a backward inside the loss function, or parameters created by the forward: the
            # sequential path, with the loss already computed (as _compute_grads would)
            step.detach()
            engine.stats.fallbacks += 1
            loss.backward(loss_scale=opt._loss_scale)
            del loss
            if self._broadcast_if_changed():
                self._compute_grads(lossfun, args, kwds)
            self.communicator.multi_node_mean_grad(target, self.zero_fill)
            return True
        engine.enter(step)
        step.arm(loss)
        try:
            loss.backward(loss_scale=opt._loss_scale)
        finally:
            step.detach()
        del loss
        engine.wait(step)
        return True


class DoubleBufferingOptimizer(_WrapperBase):
    """Overlap gradient averaging with the next step (pure_nccl only); gradients apply one step late.

    A second copy of the model holds the gradients being averaged on a side CUDA stream. Each
    update waits for the previous averaging, swaps gradients between the model and the copy (the
    model receives last step's averaged gradients, the copy this step's local ones), starts
    averaging the copy's gradients, and applies the model's (one step old) gradients.
    """

    def __init__(
        self, actual_optimizer: chainer.Optimizer, communicator: CommunicatorBase, zero_fill: bool
    ) -> None:
        super().__init__(actual_optimizer, communicator, zero_fill)
        self._set_own("synced_signature", None)
        self._set_own("communicated_target", None)
        import cupy  # double buffering exists only with pure_nccl, hence with CuPy

        self._set_own("cupy", cupy)
        self._set_own("stream", cupy.cuda.Stream(non_blocking=True))
        self._set_own("has_pending_grads", False)

    def wait(self) -> None:
        """Block until the side-stream averaging and the compute stream are done."""
        self.stream.synchronize()
        self.cupy.cuda.get_current_stream().synchronize()

    def update(self, lossfun: Any = None, *args: Any, **kwds: Any) -> None:
        observers.update_begins(self)
        target = self._target
        if lossfun is not None:
            self._compute_grads(lossfun, args, kwds)
        else:
            self._weight_grads()
        signature = param_signature(target)
        if signature != self.synced_signature:
            # New parameters: start over from rank 0's, with a fresh copy for the side stream.
            self.wait()
            self.communicator.bcast_data(target)
            self._set_own("communicated_target", copy.deepcopy(target))
            self._set_own("synced_signature", signature)
            self._set_own("has_pending_grads", False)
            observers.update_ends(self)
            return
        self.wait()
        own = dict(target.namedparams())
        side = dict(self.communicated_target.namedparams())
        for name, param in own.items():
            param.grad, side[name].grad = side[name].grad, param.grad
        self.communicator.multi_node_mean_grad(  # type: ignore[call-arg]
            self.communicated_target, self.zero_fill, stream=self.stream
        )
        if self.has_pending_grads:
            observers.apply_begins(self)
            self.actual_optimizer.update(None)
        self._set_own("has_pending_grads", True)
        observers.update_ends(self)


def create_multi_node_optimizer(
    actual_optimizer: chainer.Optimizer,
    communicator: CommunicatorBase,
    double_buffering: bool = False,
    zero_fill: bool = True,
    overlap: bool | None = None,
) -> Any:
    """Wrap ``actual_optimizer`` so its updates are synchronised over ``communicator``'s ranks.

    ``zero_fill``: gradients of initialised parameters that got none (an unused branch) are
    averaged as zeros, so every rank reduces the same arrays. ``double_buffering`` overlaps the
    averaging with the next step on a side CUDA stream and needs the ``pure_nccl`` communicator.
    ``overlap``: start averaging each bucket of gradients during backward, as soon as its
    gradients are final (in ``update(lossfun)``; other updates average after backward). None:
    on for ``pure_nccl`` (without double buffering), off elsewhere -- on CPU ranks the
    reduction and backward compete for the same cores (bench/overlap.py); True/False force it.
    It needs ``zero_fill=True`` (every rank must reduce the same buckets).
    ``MNIFY_OVERLAP=1`` (or ``0``) in the environment changes what None means, everywhere.
    """
    name = getattr(communicator, "name", None)
    if overlap is None:
        forced = environment.OVERLAP.read()
        if forced is not None:
            overlap = forced and not double_buffering and zero_fill
        else:
            overlap = name == "pure_nccl" and not double_buffering and zero_fill
    elif overlap and double_buffering:
        raise ValueError("overlap=True and double_buffering=True exclude each other")
    elif overlap and not zero_fill:
        raise ValueError("overlap=True needs zero_fill=True: every rank must reduce every bucket")
    if double_buffering:
        if getattr(communicator, "name", None) != "pure_nccl":
            raise ValueError(
                "double_buffering=True needs the 'pure_nccl' communicator "
                f"(got {getattr(communicator, 'name', type(communicator).__name__)!r}): "
                "it averages gradients on a side CUDA stream"
            )
        return DoubleBufferingOptimizer(actual_optimizer, communicator, zero_fill)
    return MultiNodeOptimizer(actual_optimizer, communicator, zero_fill, overlap=bool(overlap))
