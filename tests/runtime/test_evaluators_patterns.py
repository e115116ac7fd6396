"""Issue 12, pattern 5 on 2 and 3 ranks: iterators without reset(), metrics that are not means.

``create_multi_node_evaluator(..., gather=True)`` and ``GenericMultiNodeEvaluator`` must give
exactly what one process computes over the whole test set (an order-sensitive average
precision, a median), with empty shards, failures on one rank, and ranks that wait longer than
the collective watchdog's timeout (2 ranks: the watchdog is on and the slow ranks sleep past it).
"""

from __future__ import annotations

import pickle

import chainer
import numpy as np
import pytest

from mnify.runtime.extensions._host import from_wire, to_host, to_wire, wire_safe
from mnify.runtime.extensions.gathered_evaluator import (
    RecordingIterator,
    ReplayIterator,
    Withheld,
    WithheldTouched,
    _Session,
    array_fingerprint,
)
from tests.runtime.chainer_scripts.launch import run_script

CHECKS = [
    "averaging evaluator: iterator without reset() is copied, as Chainer does",
    "gather: evaluate() override, whole-set AP equals one process exactly",
    "gather: inputs used beyond predict are sent on a second try, still exact",
    "gather: iterator without reset()",
    "gather: ranks with empty shards",
    "gather: old-style __call__ model, converter, reports replayed",
    "gather: a failure on one rank is raised on every rank",
    "gather: in a trainer, same value on every rank, long waits untimed",
    "GenericMultiNodeEvaluator: aggregate over all ranks equals one process",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [2, 3])
def test_evaluator_patterns(n_ranks: int) -> None:
    env = {"MNIFY_EVALUATOR_CHECKS": "patterns"}
    if n_ranks == 2:
        env.update({"MNIFY_WATCHDOG_TIMEOUT": "4", "MNIFY_TEST_SLOW_RANK_SECONDS": "6"})
    run_script(n_ranks, "evaluator_checks.py", CHECKS, extra_env=env, timeout=300)


class _NoReset:
    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.position = 0

    def __next__(self) -> list[int]:
        if self.position >= len(self.items):
            raise StopIteration
        self.position += 1
        return [self.items[self.position - 1]]


def test_recording_iterator_copies_an_iterator_without_reset() -> None:
    original = _NoReset([1, 2, 3])
    recording = RecordingIterator(original, _Session())
    for _ in range(2):
        recording.reset()
        assert list(recording) == [[1], [2], [3]]
        assert recording._drawn.exhausted
    assert original.position == 0, "the original was advanced"
    assert recording._drawn.batches == [[1], [2], [3]]


def test_replay_iterator_behaves_like_a_one_pass_iterator() -> None:
    it = ReplayIterator([[1, 2], [3]], [1, 2, 3], 2)
    assert next(it) == [1, 2] and not it.is_new_epoch and it.epoch_detail == 0.5
    assert next(it) == [3] and it.is_new_epoch and it.epoch == 1
    with pytest.raises(StopIteration):
        next(it)
    it.reset()
    assert list(it) == [[1, 2], [3]]


def test_withheld_input_refuses_everything_but_its_shape() -> None:
    x = np.arange(12.0).reshape(3, 4)
    stand_in = Withheld(array_fingerprint(x), x.shape, x.dtype)
    assert stand_in.shape == (3, 4) and stand_in.ndim == 2 and stand_in.size == 12
    for touch in (np.asarray, len, lambda s: s[0], lambda s: s.sum(), lambda s: s == 1):
        with pytest.raises(WithheldTouched):
            touch(stand_in)
    assert pickle.loads(pickle.dumps(stand_in)).fingerprint == stand_in.fingerprint
    session = _Session()
    assert session.fingerprint([stand_in]) == session.fingerprint([x])


def test_session_records_outermost_calls_and_replays_them() -> None:
    session = _Session()
    inner_calls: list[int] = []

    def inner(x: np.ndarray) -> np.ndarray:
        inner_calls.append(1)
        return x * 2

    wrapped_inner = session.wrap("inner", inner)
    outer = session.wrap("outer", lambda x: wrapped_inner(x) + 1)
    x = np.arange(3.0)
    np.testing.assert_array_equal(outer(x), [1.0, 3.0, 5.0])
    assert [c[0] for c in session.calls] == ["outer"]  # inner ran inside: not recorded
    store = {
        (k, fp): __import__("collections").deque([(out, rep)]) for k, fp, out, rep in session.calls
    }
    replay = _Session(store=store)
    replayed = replay.wrap("outer", lambda x: pytest.fail("ran instead of replaying"))
    np.testing.assert_array_equal(replayed(x.copy()), [1.0, 3.0, 5.0])
    # different arguments: no record, so it runs
    ran = replay.wrap("outer", lambda x: x)
    np.testing.assert_array_equal(ran(x + 1), x + 1)
    assert len(inner_calls) == 1


def test_wire_round_trip_and_safety() -> None:
    v = chainer.Variable(np.ones(2), requires_grad=False)
    wired = to_wire({"a": [v, np.zeros(1)], "b": (1, "x")})
    back = from_wire(pickle.loads(pickle.dumps(wired)))
    assert isinstance(back["a"][0], chainer.Variable) and not back["a"][0].requires_grad
    np.testing.assert_array_equal(back["a"][0].array, [1.0, 1.0])
    assert back["b"] == (1, "x")
    assert to_host({"v": v})["v"] is v.array
    assert wire_safe([np.ones(1), v, {"k": 1.0}, None])
    assert not wire_safe(chainer.Link()) and not wire_safe(iter([1]))
    assert not wire_safe(np.array([object()]))
