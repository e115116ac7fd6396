"""Which examples a run trained on, recorded from inside the process, whatever its loop.

:func:`install` wraps Chainer's ``FunctionNode.apply``: while training (``chainer.config.train``
and backprop enabled), every input array that is data rather than a parameter or an activation
(a leaf of the graph that is no ``Parameter``, at least 2-D, rows of at least 2 numbers) has each of its rows
hashed, once per array object. An integer row loses its trailing run of ``-1`` first: that is
Chainer's padding (``pad_sequence(xs, padding=-1)`` for ``EmbedID(ignore_label=-1)``), and how much
of it a sentence gets depends on the longest sentence of its batch, not on the sentence. At exit the counts ``{row digest: times seen}`` are written as
JSON to the file named by ``MNIFY_EXAMPLES_OUT`` (outside the ranks' working directories, so
"rank 1 writes nothing" still holds). Iterators, hand-written permutation loops, generators and
trainer classes all end in the model's first function, so one hook sees them all.

:func:`check_shares` compares a single-process run with the ranks of a converted one. The
training set is what the single run saw at least twice (every example once per epoch; fresh
noise fed to a generator is seen once and is no example). Data parallel means: no example on two
ranks (beyond ``size - 1`` evening repeats; rows seen more often than most hold several examples
of equal content and may be on both) and every example on some rank.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

OUT_ENV = "MNIFY_EXAMPLES_OUT"


def _rows_of(array: Any) -> list[bytes] | None:
    """The bytes of each row of a data array (None: not an array of examples)."""
    import numpy

    shape = getattr(array, "shape", None)
    if shape is None or len(shape) < 2 or shape[0] == 0:
        return None
    host = array.get() if hasattr(array, "get") and not isinstance(array, numpy.ndarray) else array
    host = numpy.ascontiguousarray(numpy.asarray(host))
    if host.dtype == object or host[0].size < 2:
        return None
    tag = host.dtype.str.encode()
    if host.dtype.kind not in "iu":
        return [bytes(row.tobytes()) + tag for row in host]
    rows = []
    for row in host.reshape(len(host), -1):
        end = len(row)
        while end > 0 and row[end - 1] == -1:
            end -= 1
        rows.append(bytes(row[:end].tobytes()) + tag)
    return rows


def install(out_path: str) -> None:
    """Record the rows of every data array the model computes on while training."""
    import chainer
    from chainer import function_node

    # one file per rank: "{rank}" in the path is the MPI rank
    out_path = out_path.replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    counts: Counter[str] = Counter()
    seen: dict[int, weakref.ref[Any]] = {}
    original = function_node.FunctionNode.apply

    def record(data: Any) -> None:
        key = id(data)
        ref = seen.get(key)
        if ref is not None and ref() is data:
            return  # this array object was counted already (used by several functions)
        rows = _rows_of(data)
        if rows is None:
            return
        try:
            seen[key] = weakref.ref(data)
        except TypeError:
            return
        for row in rows:
            counts[hashlib.blake2b(row, digest_size=10).hexdigest()] += 1

    def apply(self: Any, inputs: Sequence[Any]) -> Any:
        if chainer.config.train and chainer.config.enable_backprop:
            for x in inputs:
                if isinstance(x, chainer.Variable):
                    if x.creator is None and not isinstance(x, chainer.Parameter):
                        record(x.array)
                elif x is not None:
                    record(x)
        return original(self, inputs)

    function_node.FunctionNode.apply = apply  # type: ignore[method-assign]

    def write() -> None:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(dict(counts), f, sort_keys=True)

    atexit.register(write)


def read(path: os.PathLike[str] | str) -> Counter[str]:
    with open(path, encoding="utf-8") as f:
        return Counter(json.load(f))


def training_set(single: Mapping[str, int]) -> set[str]:
    """The examples of a single-process run: rows it trained on more than once."""
    return {row for row, n in single.items() if n >= 2}


def check_shares(single: Mapping[str, int], ranks: Sequence[Mapping[str, int]]) -> list[str]:
    """What keeps the ranks' runs from being a data-parallel split of the single run's data."""
    examples = training_set(single)
    problems: list[str] = []
    if not examples:
        return ["the single-process run trained on no example twice: nothing to compare"]
    # rows seen more often than most are several examples with equal content (binarised
    # images): one on each rank is no repeat, so they do not count towards the overlap
    usual = Counter(single[row] for row in examples).most_common(1)[0][0]
    alike = {row for row in examples if single[row] > usual}
    per_rank = [set(r) & examples for r in ranks]
    allowed = len(ranks) - 1
    for a in range(len(ranks)):
        for b in range(a + 1, len(ranks)):
            both = (per_rank[a] & per_rank[b]) - alike
            if len(both) > allowed:
                problems.append(
                    f"ranks {a} and {b} both trained on {len(both)} of the {len(examples)} "
                    f"examples (at most {allowed} may repeat): not data parallel"
                )
    missing = examples - set().union(*per_rank)
    if missing:
        problems.append(f"{len(missing)} of the {len(examples)} training examples reached no rank")
    return problems
