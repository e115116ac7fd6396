"""Fingerprints of the training examples that reach the model, and of where they came from.

Every call of a link that is the outermost one running (the model, a Classifier, a GAN's
discriminator) in training mode is looked at through a global Chainer ``LinkHook``: each input
that is data (an array, or a Variable no function made) has one fingerprint per example, a hash
of the example's bytes; a list of arrays (sequences) has one per element. Only the first input
(``x`` of ``model(x, t)``) is hashed: labels repeat by nature.

K updates of a large dataset shuffled differently on each rank share almost no examples even
when nothing is scattered, so at the stop :func:`find_source` also looks for what the examples
were drawn from: the datasets of the training iterators alive, and the arrays held by the
script's frames. The smallest one that holds most of the examples this rank saw is its source;
the launcher compares the sources' fingerprints across ranks.
"""

from __future__ import annotations

import gc
import hashlib
import sys
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import chainer
import numpy as np

from mnify.runtime import user_frames

# bounds on what find_source hashes: a dataset that is bigger is not fingerprinted
SOURCE_MAX_EXAMPLES = 200_000
SOURCE_MAX_BYTES = 1 << 30
SOURCE_MAX_SECONDS = 20.0


def _host(array: Any) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)  # CuPy
    return np.asarray(get() if get is not None else array)


def example_hash(example: np.ndarray) -> int:
    data = np.ascontiguousarray(example)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{data.dtype.str}{data.shape}".encode())
    h.update(data.tobytes())
    return int.from_bytes(h.digest(), "little")


def _data_array(value: Any) -> Any | None:
    """The array of an input that is data, None for computed values and non-arrays."""
    if isinstance(value, chainer.Variable):
        if value.creator_node is not None:
            return None  # computed inside the step (a generator's output): not an example
        value = value.array
    if getattr(value, "ndim", 0) >= 1 and hasattr(value, "shape") and hasattr(value, "dtype"):
        return value
    return None


def example_hashes(value: Any) -> list[int] | None:
    """One hash per example of an input; None when the input is not data."""
    if isinstance(value, (list, tuple)) and value:
        arrays = [_data_array(v) for v in value]
        if all(a is not None for a in arrays):
            return [example_hash(_host(a)) for a in arrays]
        return None
    array = _data_array(value)
    if array is None:
        return None
    host = _host(array)
    return [example_hash(row) for row in host]


@dataclass
class ModelCall:
    where: str
    link: str  # the class of the link called
    batch: int


@dataclass
class ExampleRecorder(chainer.LinkHook):  # type: ignore[misc]
    """Records the examples reaching outermost link calls in training mode."""

    name = "mnify_verify_examples"
    hashes: list[int] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)
    row_shapes: set[tuple[str, tuple[int, ...]]] = field(default_factory=set)
    recording: bool = True
    _depth: int = 0
    _sites: set[tuple[str, int]] = field(default_factory=set)

    def forward_preprocess(self, args: Any) -> None:
        self._depth += 1
        if self._depth != 1 or not self.recording:
            return
        config = chainer.config
        if not config.train or not config.enable_backprop or config.in_recomputing:
            return
        inputs = list(args.args) + list(args.kwargs.values())
        if not inputs:
            return
        hashes = example_hashes(inputs[0])
        if not hashes:
            return
        self.hashes.extend(hashes)
        first = inputs[0]
        array = _data_array(first[0] if isinstance(first, (list, tuple)) else first)
        if array is not None:
            self.row_shapes.add((np.dtype(array.dtype).str, tuple(array.shape[1:])))
        caller = user_frames.user_frame(sys._getframe(1))
        site = (caller.f_code.co_filename, caller.f_lineno) if caller else ("?", 0)
        if site not in self._sites or len(self.calls) < 64:
            self._sites.add(site)
            self.calls.append(
                ModelCall(user_frames.describe(caller), type(args.link).__name__, len(hashes))
            )

    def forward_postprocess(self, args: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def step_ended(self) -> None:
        """Between updates no link is running: forget a depth left by a forward that raised."""
        self._depth = 0


@dataclass
class Source:
    what: str  # "the dataset of SerialIterator", "array x_train"
    hashes: list[int]
    hits: int


def _dataset_example(example: Any) -> Any:
    if isinstance(example, tuple) and example:
        return example[0]
    if isinstance(example, dict) and example:
        return next(iter(example.values()))
    return example


def _hash_dataset(dataset: Any, deadline: float) -> list[int] | None:
    try:
        n = len(dataset)
    except TypeError:
        return None
    if n > SOURCE_MAX_EXAMPLES:
        return None
    out, total = [], 0
    for i in range(n):
        x = _host(_dataset_example(dataset[i]))
        total += x.nbytes
        if total > SOURCE_MAX_BYTES or time.monotonic() > deadline:
            return None
        out.append(example_hash(x))
    return out


def _hash_rows(array: np.ndarray, deadline: float) -> list[int] | None:
    if len(array) > SOURCE_MAX_EXAMPLES or array.nbytes > SOURCE_MAX_BYTES:
        return None
    out = []
    for row in array:
        out.append(example_hash(row))
        if len(out) % 4096 == 0 and time.monotonic() > deadline:
            return None
    return out


def _training_iterators() -> list[Any]:
    iterator_type = chainer.dataset.Iterator
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, iterator_type) and getattr(obj, "_repeat", True):
            if hasattr(obj, "dataset") and hasattr(obj, "batch_size"):
                found.append(obj)
    return found


def _global_batch_training() -> bool:
    """Whether a global-batch iterator trains here (looked up, not imported: if its module was
    never imported, none exists)."""
    module = sys.modules.get("mnify.runtime.iterators.global_batch_iterator")
    if module is None:
        return False
    return any(isinstance(it, module.GlobalBatchIterator) for it in _training_iterators())


def iterations_per_epoch() -> int | None:
    """ceil(len(dataset) / batch_size) of the training iterator that advanced most."""
    best = None
    for it in _training_iterators():
        try:
            n, b = len(it.dataset), int(it.batch_size)
        except (TypeError, ValueError):
            continue
        if b > 0 and getattr(it, "epoch_detail", 0) > 0:
            its = -(-n // b)
            best = its if best is None else max(best, its)
    return best


def _frame_arrays(frame: FrameType | None) -> list[tuple[str, np.ndarray]]:
    found: list[tuple[str, np.ndarray]] = []
    seen: set[int] = set()
    scopes: list[dict[str, Any]] = []
    while frame is not None:
        if user_frames.kind_of(frame.f_code.co_filename) == "user":
            scopes.append(frame.f_locals)
            scopes.append(frame.f_globals)
        frame = frame.f_back
    main = sys.modules.get("__main__")
    if main is not None:
        scopes.append(vars(main))
    for scope in scopes:
        for name, value in list(scope.items()):
            values = [value] if isinstance(value, np.ndarray) else []
            if isinstance(value, (tuple, list)) and len(value) <= 4:
                values = [v for v in value if isinstance(v, np.ndarray)]
            for v in values:
                if id(v) not in seen and v.ndim >= 1:
                    seen.add(id(v))
                    found.append((name, v))
    return found


def find_source(drawn: list[int], row_shapes: set[tuple[str, tuple[int, ...]]]) -> Source | None:
    """The smallest datasets or arrays that together hold the examples this rank drew.

    Greedy: the candidate holding most of the examples not yet covered (the smaller on a tie:
    a rank's own shard before the whole array it was cut from) until nine in ten are covered or
    none adds one in twenty. A GAN's two domains are two iterators: both are taken; its noise
    is in none.
    """
    if not drawn:
        return None
    if _global_batch_training():
        # every rank holds the whole dataset by design and the schedule gives each its own
        # part of every global batch (docs/global_batch.md): the examples drawn are compared
        return None
    deadline = time.monotonic() + SOURCE_MAX_SECONDS
    wanted = set(drawn)
    candidates: list[tuple[str, list[int], set[int]]] = []

    def consider(what: str, hashes: list[int] | None) -> None:
        if hashes:
            hits = wanted.intersection(hashes)
            if hits:
                candidates.append((what, hashes, hits))

    for it in _training_iterators():
        consider(f"the dataset of a {type(it).__name__}", _hash_dataset(it.dataset, deadline))
    for name, array in _frame_arrays(sys._getframe(1)):
        if (array.dtype.str, tuple(array.shape[1:])) in row_shapes:
            consider(f"array {name}", _hash_rows(array, deadline))
    chosen: list[tuple[str, list[int], set[int]]] = []
    covered: set[int] = set()
    while candidates and len(covered) * 10 < len(wanted) * 9:
        best = max(candidates, key=lambda c: (len(c[2] - covered), -len(c[1])))
        if len(best[2] - covered) * 20 < len(wanted):
            break
        chosen.append(best)
        covered |= best[2]
        candidates.remove(best)
    if not chosen:
        return None  # (inputs made inside the step, a GAN's noise, are in no source)
    hashes = [h for _, hs, _ in chosen for h in hs]
    return Source(" and ".join(what for what, _, _ in chosen), hashes, len(covered))
