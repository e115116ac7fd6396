"""``create_multi_node_evaluator(evaluator, comm, gather=True)``: the metric over the whole test set.

Averaging per-rank results is right for means over examples (loss, accuracy) and wrong for
metrics computed over the whole set at once: detection mAP, segmentation mIoU, ROC-AUC, BLEU,
or whatever a user's ``evaluate()`` override computes. This wrapper runs the evaluator's own
``evaluate()``, unchanged, in two passes:

1. **Every rank** runs ``evaluate()`` over its shard while recording the batches its iterators
   hand out and what the model answered: every outermost call of the targets' methods
   (``forward``, an old-style ``__call__``, ``predict`` and the other public methods of the
   user's classes, ``eval_func``) with a fingerprint of its arguments, its return value and the
   values it reported. This pass's own metric (over one shard) is thrown away.
2. The records are gathered to **rank 0**, which runs ``evaluate()`` once more over every
   rank's batches in rank order (the order of the unscattered test set). A call whose arguments
   match a recorded fingerprint returns the recorded answer and re-reports its values instead
   of running the model; anything else runs for real. So the result is what ``evaluate()``
   computes over the whole test set: fast when the model's calls were recorded, slower but
   still right when they were not.
3. Rank 0 broadcasts the result and every rank returns it: every rank reports the same values
   (an ``EarlyStoppingTrigger`` stops all ranks together).

Inputs of 64 KiB or more that went straight into a recorded call (images handed to
``predict``) are not sent: a :class:`Withheld` placeholder with the same fingerprint stands for
them. Should rank 0's pass touch one (``evaluate()`` used the image for something else), rank 0
asks once for the real data and runs its pass again.

Waits: ranks finish their shards at different times and rank 0 computes the metric alone, so
both waits are untimed barriers (the collective watchdog times only the transfers after them).
An error in one rank's pass is raised on every rank, never left as a hang; an error in the
first pass after the shard was fully read (a metric undefined on an empty shard) is ignored.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import inspect
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np

from mnify.runtime.extensions._host import (
    from_wire,
    host_array,
    is_device_array,
    to_host,
    to_wire,
    wire_safe,
)

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase

# inputs at least this large that went straight into a recorded call are not sent to rank 0
WITHHOLD_BYTES = 1 << 16
# classes of these packages are the framework's: only their ``forward`` is intercepted
_FRAMEWORK_ROOTS = frozenset(
    {"chainer", "chainerx", "chainermn", "mnify", "builtins", "numpy", "cupy"}
)
_SCALARS = (type(None), bool, int, float, complex, str, bytes, np.generic)
_MISSING = object()


class WithheldTouched(RuntimeError):
    """Rank 0's pass used an input that was not sent (see the module docstring)."""


class Withheld:
    """Stands on rank 0 for an input array another rank did not send. It has the array's
    fingerprint, shape and dtype; anything else done with it raises :class:`WithheldTouched`."""

    def __init__(self, fingerprint: Hashable, shape: tuple[int, ...], dtype: np.dtype[Any]):
        self.fingerprint = fingerprint
        self.shape = shape
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise WithheldTouched(f"evaluate() used .{name} of an input that was not sent")

    def _touched(self, *args: Any, **kwargs: Any) -> Any:
        raise WithheldTouched("evaluate() computed with an input that was not sent")

    __array__ = _touched
    __len__ = _touched
    __getitem__ = _touched
    __iter__ = _touched
    __eq__ = _touched
    __ne__ = _touched
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<input {self.shape} {self.dtype} kept on its rank>"


def array_fingerprint(x: np.ndarray) -> Hashable | None:
    """Dtype, shape and a digest of the contents (None for object arrays)."""
    if x.dtype.hasobject:
        return None
    digest = hashlib.blake2b(np.ascontiguousarray(x).data, digest_size=16).digest()
    return ("A", x.dtype.str, tuple(x.shape), digest)


def _current_observation() -> dict[str, Any] | None:
    try:
        return chainer.reporter.get_current_reporter().observation  # type: ignore[no-any-return]
    except IndexError:  # no reporter current
        return None


# ------------------------------------------------------------------------------ the session
@dataclass(eq=False)
class _Session:
    """One pass of one rank: recording (first pass) or replaying (rank 0's pass)."""

    store: dict[tuple[str, Hashable], deque[tuple[Any, Any]]] | None = None
    depth: int = 0
    calls: list[tuple[str, Hashable, Any, Any]] = field(default_factory=list)
    # large numpy arrays of the batches drawn so far (kept alive, so ids stay unique)
    batch_arrays: dict[int, np.ndarray] = field(default_factory=dict)
    digests: dict[int, Hashable | None] = field(default_factory=dict)
    fed: set[int] = field(default_factory=set)  # ... those handed straight to a recorded call

    @property
    def recording(self) -> bool:
        return self.store is None

    def register_batch(self, batch: Any, depth: int = 0) -> None:
        if isinstance(batch, np.ndarray):
            if batch.nbytes >= WITHHOLD_BYTES:
                self.batch_arrays[id(batch)] = batch
        elif isinstance(batch, (list, tuple)) and depth < 4:
            for item in batch:
                self.register_batch(item, depth + 1)
        elif isinstance(batch, dict) and depth < 4:
            for item in batch.values():
                self.register_batch(item, depth + 1)

    def fingerprint(self, obj: Any, depth: int = 0) -> Hashable | None:
        """What identifies a call's arguments; None: unknown, so the call always runs."""
        if depth > 32:
            return None
        if isinstance(obj, Withheld):
            return obj.fingerprint
        if isinstance(obj, chainer.Variable):
            inner = self.fingerprint(obj.array, depth + 1)
            return None if inner is None else ("V", inner)
        if isinstance(obj, np.ndarray):
            key = id(obj)
            if self.batch_arrays.get(key) is obj:
                self.fed.add(key)
                if key not in self.digests:
                    self.digests[key] = array_fingerprint(obj)
                return self.digests[key]
            return array_fingerprint(obj)
        if is_device_array(obj):
            return array_fingerprint(host_array(obj))
        if isinstance(obj, (list, tuple)):
            parts = [self.fingerprint(x, depth + 1) for x in obj]
            return None if any(p is None for p in parts) else ("L", tuple(parts))
        if isinstance(obj, dict):
            items = []
            for k in sorted(obj, key=repr):
                value = self.fingerprint(obj[k], depth + 1)
                if value is None or not isinstance(k, _SCALARS):
                    return None
                items.append((repr(k), value))
            return ("D", tuple(items))
        if isinstance(obj, _SCALARS):
            return ("S", type(obj).__name__, repr(obj))
        return None

    def wrap(self, key: str, func: Callable[..., Any]) -> Callable[..., Any]:
        """``func`` recorded (first pass) or answered from the records (rank 0's pass) when
        it is the outermost intercepted call."""
        session = self

        @functools.wraps(func)
        def intercepted(*args: Any, **kwargs: Any) -> Any:
            if session.depth:
                return func(*args, **kwargs)
            session.depth += 1
            try:
                return session._call(key, func, args, kwargs)
            finally:
                session.depth -= 1

        return intercepted

    def _call(self, key: str, func: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        fingerprint = self.fingerprint((args, kwargs))
        if self.store is not None:
            queue = self.store.get((key, fingerprint)) if fingerprint is not None else None
            if not queue:
                return func(*args, **kwargs)
            output, reports = queue.popleft()
            observation = _current_observation()
            if observation is not None and reports:
                observation.update(from_wire(reports))
            return from_wire(output)
        observation = _current_observation()
        before = dict(observation) if observation is not None else {}
        output = func(*args, **kwargs)
        if fingerprint is None:
            return output
        reports = {}
        if observation is not None:
            reports = {k: v for k, v in observation.items() if before.get(k, _MISSING) is not v}
        if wire_safe(output) and wire_safe(reports):
            self.calls.append((key, fingerprint, _copied(to_wire(output)), to_wire(reports)))
        return output

    def wire_batch(self, batch: Any, withhold: bool, depth: int = 0) -> Any:
        """A drawn batch ready to send: device arrays to host, fed inputs withheld."""
        if isinstance(batch, np.ndarray):
            key = id(batch)
            if withhold and key in self.fed and self.batch_arrays.get(key) is batch:
                fingerprint = self.digests.get(key)
                if fingerprint is not None:
                    return Withheld(fingerprint, tuple(batch.shape), batch.dtype)
            return batch
        if isinstance(batch, list):
            return [self.wire_batch(x, withhold, depth + 1) for x in batch]
        if isinstance(batch, tuple):
            items = [self.wire_batch(x, withhold, depth + 1) for x in batch]
            return type(batch)._make(items) if hasattr(batch, "_make") else tuple(items)
        if isinstance(batch, dict):
            return {k: self.wire_batch(v, withhold, depth + 1) for k, v in batch.items()}
        return to_wire(batch)


def _copied(wired: Any) -> Any:
    """Recorded answers are copied: evaluate() may change the arrays it was given in place."""
    if isinstance(wired, np.ndarray):
        return wired.copy()
    if isinstance(wired, list):
        return [_copied(x) for x in wired]
    if isinstance(wired, tuple):
        items = [_copied(x) for x in wired]
        return type(wired)._make(items) if hasattr(wired, "_make") else tuple(items)
    if isinstance(wired, dict):
        return {k: _copied(v) for k, v in wired.items()}
    return wired


# ------------------------------------------------------------------------------ iterators
@dataclass(eq=False)
class _Drawn:
    """Shared by a recording iterator and its shallow copies (``copy.copy(it)`` in evaluate)."""

    source: Any
    batches: list[Any] = field(default_factory=list)
    exhausted: bool = False
    used_dataset: bool = False


def dataset_is_empty(iterator: Any) -> bool:
    """An iterator over an empty shard: Chainer's iterators divide by the dataset's length."""
    try:
        dataset = iterator.dataset
        return dataset is not None and len(dataset) == 0
    except Exception:
        return False


def _advance(iterator: Any) -> Any:
    step = getattr(iterator, "__next__", None) or iterator.next
    return step()


class RecordingIterator:
    """The first pass's iterator: hands out the rank's batches and keeps them.

    ``reset()`` resets the wrapped iterator or, for an iterator without ``reset()``, starts
    over from a ``copy.copy`` of it (what Chainer's Evaluator does), so the original is
    never advanced by an evaluation that resets first.
    """

    def __init__(self, original: Any, session: _Session) -> None:
        self._original = original
        self._session = session
        self._drawn = _Drawn(original)

    def reset(self) -> None:
        drawn = self._drawn
        if hasattr(self._original, "reset"):
            self._original.reset()
            drawn.source = self._original
        else:
            drawn.source = copy.copy(self._original)
        drawn.batches.clear()
        drawn.exhausted = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        drawn = self._drawn
        if dataset_is_empty(drawn.source):
            drawn.exhausted = True
            raise StopIteration
        try:
            batch = _advance(drawn.source)
        except StopIteration:
            drawn.exhausted = True
            raise
        drawn.batches.append(batch)
        self._session.register_batch(batch)
        return batch

    next = __next__

    @property
    def dataset(self) -> Any:
        self._drawn.used_dataset = True
        return self._drawn.source.dataset

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._drawn.source, name)


class ReplayIterator:
    """Rank 0's pass: every rank's batches in rank order, as a non-repeating iterator."""

    def __init__(self, batches: list[Any], dataset: list[Any], batch_size: Any) -> None:
        self._batches = batches
        self.dataset = dataset
        self.batch_size = batch_size
        self.repeat = False
        self.current_position = 0
        self.epoch = 0
        self.is_new_epoch = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.current_position >= len(self._batches):
            raise StopIteration
        batch = from_wire(self._batches[self.current_position])
        self.current_position += 1
        self.is_new_epoch = self.current_position == len(self._batches)
        if self.is_new_epoch:
            self.epoch = 1
        return batch

    next = __next__

    def reset(self) -> None:
        self.current_position = 0
        self.epoch = 0
        self.is_new_epoch = False

    @property
    def epoch_detail(self) -> float:
        if not self._batches:
            return float(self.epoch)
        return self.epoch + (
            0.0 if self.is_new_epoch else self.current_position / len(self._batches)
        )

    @property
    def previous_epoch_detail(self) -> float | None:
        return None

    def serialize(self, serializer: Any) -> None:
        return None

    def finalize(self) -> None:
        return None


# ------------------------------------------------------------------------------ interception
def _package(cls: type) -> str:
    return (getattr(cls, "__module__", "") or "").split(".")[0]


def _methods(link: Any) -> list[str]:
    """``forward`` and the public methods the user's (or another library's) classes define."""
    names = {"forward"} if callable(getattr(type(link), "forward", None)) else set()
    for klass in type(link).__mro__:
        if _package(klass) in _FRAMEWORK_ROOTS:
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(value):
                names.add(name)
    return sorted(names)


def _call_owner(cls: type) -> type | None:
    """The user class that overrides ``__call__`` (old-style Chainer code), if any."""
    for klass in cls.__mro__:
        if "__call__" in vars(klass):
            return None if _package(klass) in _FRAMEWORK_ROOTS else klass
    return None


_CALL_SUBCLASSES: dict[type, type] = {}


def _call_subclass(cls: type) -> type:
    """``cls`` whose ``__call__`` goes through the instance's interceptor."""
    sub = _CALL_SUBCLASSES.get(cls)
    if sub is None:

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self.__dict__["_mn_intercepted_call"](*args, **kwargs)

        namespace = {"__call__": __call__, "__module__": cls.__module__}
        namespace["__qualname__"] = cls.__qualname__
        sub = type(cls)(cls.__name__, (cls,), namespace)
        _CALL_SUBCLASSES[cls] = sub
    return sub


def _patch_link(link: Any, base: str, session: _Session, undo: list[Callable[[], None]]) -> None:
    for name in _methods(link):
        previous = link.__dict__.get(name, _MISSING)
        object.__setattr__(link, name, session.wrap(f"{base}.{name}", getattr(link, name)))

        def restore(link: Any = link, name: str = name, previous: Any = previous) -> None:
            if previous is _MISSING:
                object.__delattr__(link, name)
            else:
                object.__setattr__(link, name, previous)

        undo.append(restore)
    owner = _call_owner(type(link))
    if owner is None:
        return
    original_class = type(link)
    link.__dict__["_mn_intercepted_call"] = session.wrap(
        f"{base}.__call__",
        owner.__call__.__get__(link),  # type: ignore[attr-defined]
    )
    try:
        link.__class__ = _call_subclass(original_class)
    except TypeError:  # a layout that cannot change class: its calls simply run
        del link.__dict__["_mn_intercepted_call"]
        return

    def restore_class() -> None:
        link.__class__ = original_class
        del link.__dict__["_mn_intercepted_call"]

    undo.append(restore_class)


@contextlib.contextmanager
def _installed(evaluator: Any, session: _Session, iterators: dict[str, Any]) -> Iterator[None]:
    """The evaluator's iterators replaced and its targets' methods intercepted, for one pass."""
    saved = dict(evaluator._iterators)
    undo: list[Callable[[], None]] = []
    try:
        evaluator._iterators.update(iterators)
        seen: set[int] = set()
        for target_name, target in evaluator._targets.items():
            if not isinstance(target, chainer.Link):
                continue
            for path, link in target.namedlinks():
                if id(link) not in seen:
                    seen.add(id(link))
                    _patch_link(link, f"{target_name}{path}", session, undo)
        eval_func = getattr(evaluator, "eval_func", None)
        if eval_func is not None:
            evaluator.eval_func = session.wrap("eval_func", eval_func)
            undo.append(lambda: setattr(evaluator, "eval_func", eval_func))
        yield
    finally:
        for step in reversed(undo):
            step()
        evaluator._iterators.clear()
        evaluator._iterators.update(saved)


# ------------------------------------------------------------------------------ the protocol
def _flat_examples(batches: list[Any]) -> list[Any]:
    out: list[Any] = []
    for batch in batches:
        if isinstance(batch, list):
            out.extend(batch)
    return out


def _drawn_count(batches: list[Any]) -> int | None:
    try:
        return sum(len(b) for b in batches)
    except TypeError:
        return None


def _pack(
    session: _Session, iterators: dict[str, RecordingIterator], withhold: bool
) -> dict[str, Any]:
    packed: dict[str, Any] = {}
    for name, it in iterators.items():
        drawn = it._drawn
        dataset = None
        if drawn.used_dataset:
            # evaluate() read the dataset itself: send it when the batches do not cover it
            try:
                whole = drawn.source.dataset
                if _drawn_count(drawn.batches) != len(whole):
                    dataset = [to_wire(example) for example in whole]
            except Exception:
                dataset = None
        packed[name] = {
            "batches": [session.wire_batch(b, withhold) for b in drawn.batches],
            "dataset": dataset,
            "batch_size": getattr(drawn.source, "batch_size", None),
        }
    return packed


def _count_withheld(obj: Any) -> int:
    if isinstance(obj, Withheld):
        return 1
    if isinstance(obj, (list, tuple)):
        return sum(_count_withheld(x) for x in obj)
    if isinstance(obj, dict):
        return sum(_count_withheld(x) for x in obj.values())
    return 0


def _rank0_pass(evaluator: Any, payloads: list[dict[str, Any]], calls: list[Any]) -> Any:
    """Rank 0: evaluate() over every rank's batches, answered from the records."""
    store: dict[tuple[str, Hashable], deque[tuple[Any, Any]]] = defaultdict(deque)
    for rank_calls in calls:
        for key, fingerprint, output, reports in rank_calls:
            store[(key, fingerprint)].append((output, reports))
    iterators: dict[str, Any] = {}
    for name in payloads[0]["iterators"]:
        parts = [p["iterators"][name] for p in payloads]
        batches = [b for part in parts for b in part["batches"]]
        dataset: list[Any] = []
        for part in parts:
            if part["dataset"] is not None:
                dataset.extend(from_wire(part["dataset"]))
            else:
                dataset.extend(from_wire(_flat_examples(part["batches"])))
        iterators[name] = ReplayIterator(batches, dataset, parts[0]["batch_size"])
    with _installed(evaluator, _Session(store=store), iterators):
        return evaluator._mn_original_evaluate()


def _first_pass(evaluator: Any) -> tuple[_Session, dict[str, RecordingIterator], Exception | None]:
    session = _Session()
    iterators = {name: RecordingIterator(it, session) for name, it in evaluator._iterators.items()}
    try:
        with _installed(evaluator, session, iterators):
            evaluator._mn_original_evaluate()
    except Exception as exc:
        # the whole shard was read: only this shard's own metric failed (an empty shard)
        if not (iterators and all(it._drawn.exhausted for it in iterators.values())):
            return session, iterators, exc
    return session, iterators, None


def gathered_evaluate(evaluator: Any) -> Any:
    """The patched ``evaluate`` of ``create_multi_node_evaluator(..., gather=True)``."""
    comm: CommunicatorBase = evaluator._mn_communicator
    if comm.size == 1:
        return evaluator._mn_original_evaluate()
    session, iterators, error = _first_pass(evaluator)
    withhold = True
    calls: list[Any] = []
    while True:
        payload = {
            "iterators": _pack(session, iterators, withhold),
            "calls": session.calls if withhold else None,
            "error": None if error is None else repr(error),
        }
        comm.barrier()  # untimed: the ranks' shards take different times
        gathered = comm.gather_obj(payload, root=0)
        status: tuple[str, Any] = ("ok", None)
        own: Exception | None = None
        if gathered is not None:
            if withhold:
                calls = [p["calls"] for p in gathered]
            failed = [f"rank {r}: {p['error']}" for r, p in enumerate(gathered) if p["error"]]
            if failed:
                status = ("error", "; ".join(failed))
            else:
                withheld = _count_withheld([p["iterators"] for p in gathered])
                try:
                    status = ("ok", to_host(_rank0_pass(evaluator, gathered, calls)))
                except Exception as exc:
                    if withheld and withhold:
                        status = ("again", repr(exc))
                    else:
                        status, own = ("error", f"rank 0: {exc!r}"), exc
        comm.barrier()  # untimed: rank 0 computed the metric alone
        status = comm.bcast_obj(status, root=0)
        if status[0] == "again":
            withhold = False
            continue
        break
    if status[0] == "error":
        if own is not None:
            raise own
        if error is not None:
            raise error
        raise RuntimeError(f"multi-node evaluation failed: {status[1]}")
    return status[1]
