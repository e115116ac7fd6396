"""What a rank's runtime is doing, told to whoever subscribed: the public way to watch it.

The communicators publish where their work begins and ends -- each public collective and
point-to-point call (its kind, payload bytes, peer and number), each bucket of a reduction, each
wait inside MPI (or on the other ranks in a shared-memory segment), each pack/unpack kernel --
and the multi-node optimizers publish their updates. The timeline (:mod:`mnify.runtime.timeline`),
the rank state of ``mnify run`` (:mod:`mnify.runtime.rank_state`) and ``mnify scale`` subscribe
an :class:`Observer` with :func:`subscribe`, which returns the function that unsubscribes it.
Nobody patches the communicator's methods, so renaming a private one cannot lose events.

The collective's number is the communicator's own count (``_seq``, kept by its ``_enter``; the
same on every rank), so the watchdog, the rank state and the timeline name a collective alike.
Only the outermost of nested collectives is published (``allreduce_grad`` calls
``multi_node_mean_grad``); collectives from several threads at once are not supported.

When nobody subscribed, each publishing point costs one test of a list: nothing is wrapped,
nothing recorded. The observers run on the rank's own thread, inside the work they watch: they
must be quick and must not raise (what they raise propagates into the training).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Observer:
    """Receives the runtime's events; every method does nothing unless overridden.

    ``comm`` is the communicator, ``kind`` the public method's name, ``seq`` the collective's
    number on ``comm`` (for a point-to-point call: the last collective's), ``peer`` the other
    rank of a point-to-point call (-1 if not an int), ``nbytes`` the payload (a model's
    parameter bytes for the model collectives, 0 for objects).
    """

    def collective_enters(
        self,
        comm: Any,
        kind: str,
        seq: int,
        nbytes: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """A public collective begins (``args``/``kwargs``: what it was called with)."""

    def collective_leaves(self, comm: Any, kind: str, seq: int, failed: bool, result: Any) -> None:
        """It returned (``failed``: it raised)."""

    def point_to_point_enters(
        self, comm: Any, kind: str, seq: int, peer: int, args: tuple[Any, ...]
    ) -> None:
        """A ``send``/``recv`` (or ``_obj``) with rank ``peer`` begins."""

    def point_to_point_leaves(
        self, comm: Any, kind: str, seq: int, failed: bool, result: Any
    ) -> None:
        """It returned."""

    def bucket_begins(self, nbytes: int) -> None:
        """One bucket of the current reduction begins (nested buckets are published too)."""

    def bucket_ends(self, nbytes: int, failed: bool) -> None:
        """The bucket begun last is reduced."""

    def kernel_begins(self, kind: str, buffer: Any) -> None:
        """A pack/unpack kernel (``kind``) into or out of the staging ``buffer`` begins."""

    def kernel_ends(self, kind: str, buffer: Any) -> None:
        """It returned."""

    def overlap_bucket_starts(self, number: int, nbytes: int) -> None:
        """A non-blocking bucket of an overlapped gradient mean was started (in backward)."""

    def overlap_buckets_done(self) -> None:
        """The wait that completes every overlapped bucket started so far is over."""

    def wait_begins(self) -> None:
        """This rank is about to wait on the others (inside MPI, or a shared-memory counter)."""

    def wait_ends(self) -> None:
        """The wait is over (completed or raised)."""

    def update_begins(self, optimizer: Any) -> None:
        """The multi-node optimizer's ``update`` began (forward, backward, mean follow)."""

    def apply_begins(self, optimizer: Any) -> None:
        """The wrapped optimizer is about to apply the averaged gradients."""

    def update_ends(self, optimizer: Any) -> None:
        """The update is over (applied, or only broadcast the parameters)."""


# The subscribers, in order; mutated in place so that publishers may hold the list itself.
_active: list[Observer] = []
_depth = 0  # inside a published collective or point-to-point call


def subscribe(observer: Observer) -> Callable[[], None]:
    """Send the runtime's events to ``observer`` from now on; returns what unsubscribes it."""
    _active.append(observer)

    def unsubscribe() -> None:
        if observer in _active:
            _active.remove(observer)

    return unsubscribe


def subscribers() -> tuple[Observer, ...]:
    """Who is subscribed now (empty: every publishing point is a test of an empty list)."""
    return tuple(_active)


# -- publishing: collectives and point-to-point calls (wrapped where they are defined) ----------

# collectives whose first argument is a model (payload: its parameters' bytes, once per model)
_MODEL_COLLECTIVES = frozenset(
    {"allreduce_grad", "bcast_data", "broadcast_data", "multi_node_mean_grad"}
)
_model_bytes: dict[int, tuple[Any, int]] = {}


def payload_bytes(kind: str, args: tuple[Any, ...]) -> int:
    """Bytes of a collective's payload: a model's parameters, an array, a list of arrays."""
    if not args:
        return 0
    x = args[0]
    if kind in _MODEL_COLLECTIVES:
        known = _model_bytes.get(id(x))
        if known is not None and known[0] is x:
            return known[1]
        try:
            total = sum(
                int(getattr(getattr(p, "data", None), "nbytes", 0) or 0) for _, p in x.namedparams()
            )
        except Exception:
            total = 0
        _model_bytes[id(x)] = (x, total)
        return total
    n = getattr(x, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(x, list | tuple):
        # arrays, or the (peer, array) pairs of a halo exchange's sends
        return sum(int(getattr(a[-1] if isinstance(a, tuple) else a, "nbytes", 0) or 0) for a in x)
    return 0


def published_collective(kind: str, method: F) -> F:
    """``method`` (a communicator's public collective ``kind``) publishing its enter and leave."""

    @functools.wraps(method)
    def collective(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _depth
        if not _active or _depth:
            return method(self, *args, **kwargs)
        # the number its _enter is about to give it (every public collective enters once)
        seq = self._seq + 1
        nbytes = payload_bytes(kind, args)
        for o in _active:
            o.collective_enters(self, kind, seq, nbytes, args, kwargs)
        _depth = 1
        failed, result = True, None
        try:
            result = method(self, *args, **kwargs)
            failed = False
            return result
        finally:
            _depth = 0
            for o in reversed(_active):
                o.collective_leaves(self, kind, seq, failed, result)

    return collective  # type: ignore[return-value]


def point_to_point(method: F) -> F:
    """Mark a ``send``/``recv`` method: it publishes its enter and leave (with the peer)."""
    kind = method.__name__
    receives = kind.startswith("recv")

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _depth
        if not _active or _depth:
            return method(self, *args, **kwargs)
        if receives:
            peer = args[0] if args else kwargs.get("source", -1)
        else:
            peer = args[1] if len(args) > 1 else kwargs.get("dest", -1)
        peer = peer if isinstance(peer, int) else -1
        seq = self._seq
        for o in _active:
            o.point_to_point_enters(self, kind, seq, peer, args)
        _depth = 1
        failed, result = True, None
        try:
            result = method(self, *args, **kwargs)
            failed = False
            return result
        finally:
            _depth = 0
            for o in reversed(_active):
                o.point_to_point_leaves(self, kind, seq, failed, result)

    setattr(call, POINT_TO_POINT_MARK, True)
    return call  # type: ignore[return-value]


POINT_TO_POINT_MARK = "__mnify_point_to_point__"


def point_to_point_names(cls: type) -> frozenset[str]:
    """The point-to-point methods of ``cls`` (marked with :func:`point_to_point`)."""
    return frozenset(
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if getattr(value, POINT_TO_POINT_MARK, False)
    )


# -- publishing: inside a collective --------------------------------------------------------------


class _Span:
    """A published bucket or kernel: begins on entry, ends on exit."""

    __slots__ = ("nbytes", "kind", "buffer")

    def __init__(self, nbytes: int, kind: str = "", buffer: Any = None) -> None:
        self.nbytes, self.kind, self.buffer = nbytes, kind, buffer

    def __enter__(self) -> None:
        if self.kind:
            for o in _active:
                o.kernel_begins(self.kind, self.buffer)
        else:
            for o in _active:
                o.bucket_begins(self.nbytes)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.kind:
            for o in reversed(_active):
                o.kernel_ends(self.kind, self.buffer)
        else:
            for o in reversed(_active):
                o.bucket_ends(self.nbytes, exc is not None)


_NOTHING = contextlib.nullcontext()


def bucket(nbytes: int) -> contextlib.AbstractContextManager[None]:
    """``with bucket(n):`` around one bucket's reduction of ``n`` bytes."""
    return _Span(nbytes) if _active else _NOTHING


def kernel(kind: str, buffer: Any) -> contextlib.AbstractContextManager[None]:
    """``with kernel("pack", buf):`` around a pack or unpack through the staging ``buf``."""
    return _Span(0, kind, buffer) if _active else _NOTHING


class BucketStream:
    """A pipelined reduction's buckets as it takes them: bucket k spans from taking it to
    taking bucket k + 1 (the last one's to the end of the ``with`` block)."""

    def __init__(self, buckets: Iterable[Any], nbytes_of: Callable[[Any], int]) -> None:
        self._buckets = buckets
        self._nbytes_of = nbytes_of
        self._open: int | None = None

    def __iter__(self) -> Iterator[Any]:
        for item in self._buckets:
            self._close(False)
            nbytes = self._nbytes_of(item)
            for o in _active:
                o.bucket_begins(nbytes)
            self._open = nbytes
            yield item

    def _close(self, failed: bool) -> None:
        if self._open is not None:
            nbytes, self._open = self._open, None
            for o in reversed(_active):
                o.bucket_ends(nbytes, failed)

    def __enter__(self) -> BucketStream:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(exc is not None)


def bucket_stream(buckets: Iterable[Any], nbytes_of: Callable[[Any], int]) -> BucketStream | None:
    """The buckets published as a :class:`BucketStream`; None when nobody watches."""
    return BucketStream(buckets, nbytes_of) if _active else None


def overlap_bucket_starts(number: int, nbytes: int) -> None:
    if _active:
        for o in _active:
            o.overlap_bucket_starts(number, nbytes)


def overlap_buckets_done() -> None:
    if _active:
        for o in _active:
            o.overlap_buckets_done()


def wait_begins() -> None:
    if _active:
        for o in _active:
            o.wait_begins()


def wait_ends() -> None:
    if _active:
        for o in _active:
            o.wait_ends()


# -- publishing: the optimizer's update -----------------------------------------------------------


def update_begins(optimizer: Any) -> None:
    if _active:
        for o in _active:
            o.update_begins(optimizer)


def apply_begins(optimizer: Any) -> None:
    if _active:
        for o in _active:
            o.apply_begins(optimizer)


def update_ends(optimizer: Any) -> None:
    if _active:
        for o in _active:
            o.update_ends(optimizer)
