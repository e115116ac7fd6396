"""Rank script: models split layer-wise with MultiNodeChainList train like the whole model.

Every rank builds only its pieces; each piece is created right after ``np.random.seed(k)``
wherever it lives, and the single-process reference builds the same pieces the same way. After
a few SGD steps on the same batches, each rank's pieces must equal the reference's.

``line`` (an MLP of three layers)
    2 ranks: rank 0 runs layer 0 and sends to rank 1, which runs layer 1 and sends back; rank 0
    runs layer 2 and produces the output (a delegate threaded into a recv; two pieces on a rank).
    3 ranks: a pipeline 0 -> 1 -> 2 with the output on rank 2.
``fan`` (a = A(x); b = B(a); out = C(a, b))
    2 ranks: rank 0 runs A, keeps a for itself and sends it to rank 1 (B), then C reads from
    itself and from rank 1 (fan-out with a self-send, fan-in mixing self and remote: the two
    ranks exchange in both directions, so backward order matters).
    3 ranks: A on rank 0 sends to ranks 1 and 2; B on rank 1 sends to 2; C on rank 2 reads
    from 0 and 1.
Prints ``PASS <name>`` per check (tests/support/rank_checks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify.runtime.links import MultiNodeChainList
from tests.support.rank_checks import assert_close, make_comm, passed

comm = make_comm()
rank, size = comm.rank, comm.size
STEPS = 4


class Piece(chainer.Chain):
    """Linear on the concatenated inputs, tanh unless it is the model's last piece."""

    def __init__(self, seed: int, n_in: int, n_out: int, last: bool = False) -> None:
        super().__init__()
        np.random.seed(seed)
        with self.init_scope():
            self.fc = L.Linear(n_in, n_out)
        self.last = last

    def forward(self, *xs: Any) -> Any:
        h = self.fc(xs[0] if len(xs) == 1 else F.concat(xs, axis=1))
        return h if self.last else F.tanh(h)


def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1000 + step)
    return rng.normal(size=(8, 6)).astype(np.float32), rng.randint(0, 3, 8).astype(np.int32)


def line_pieces() -> list[Piece]:
    return [Piece(0, 6, 8), Piece(1, 8, 7), Piece(2, 7, 3, last=True)]


def line_reference(p: list[Piece], x: Any) -> Any:
    return p[2](p[1](p[0](x)))


def fan_pieces() -> list[Piece]:
    return [Piece(10, 6, 8), Piece(11, 8, 7), Piece(12, 8 + 7, 3, last=True)]


def fan_reference(p: list[Piece], x: Any) -> Any:
    a = p[0](x)
    return p[2](a, p[1](a))


# piece index -> (rank, rank_in, rank_out), per topology and size; pieces in each rank's order
ROUTES: dict[tuple[str, int], list[tuple[int, int, Any, Any]]] = {
    ("line", 2): [(0, 0, None, 1), (1, 1, 0, 0), (2, 0, 1, None)],
    ("line", 3): [(0, 0, None, 1), (1, 1, 0, 2), (2, 2, 1, None)],
    ("fan", 2): [(0, 0, None, [0, 1]), (1, 1, 0, 0), (2, 0, [0, 1], None)],
    ("fan", 3): [(0, 0, None, [1, 2]), (1, 1, 0, 2), (2, 2, [0, 1], None)],
}


def check(
    name: str,
    make_pieces: Callable[[], list[Piece]],
    reference_fn: Callable[[list[Piece], Any], Any],
) -> None:
    routes = ROUTES[(name, size)]
    output_rank = next(r for _, r, _, out in routes if out is None)
    pieces = make_pieces()
    model = MultiNodeChainList(comm)
    owned = []
    for index, piece_rank, rank_in, rank_out in routes:
        if piece_rank == rank:
            model.add_link(pieces[index], rank_in=rank_in, rank_out=rank_out)
            owned.append(index)
    optimizer = chainer.optimizers.SGD(lr=0.2)
    optimizer.setup(model)

    def lossfun(x: np.ndarray, t: np.ndarray) -> chainer.Variable:
        out = model(x)
        if rank == output_rank:
            return F.softmax_cross_entropy(out, t)
        assert isinstance(out, chainer.Variable) and out.size == 0, "expected a delegate"
        return out

    if owned:
        for step in range(STEPS):
            optimizer.update(lossfun, *batches(step))

    reference = make_pieces()
    ref_opt = chainer.optimizers.SGD(lr=0.2)
    ref_opt.setup(chainer.ChainList(*reference))
    for step in range(STEPS):
        x, t = batches(step)
        ref_opt.update(lambda x, t: F.softmax_cross_entropy(reference_fn(reference, x), t), x, t)

    untrained = make_pieces()
    for k in owned:
        assert_close(f"{name} piece {k} W", pieces[k].fc.W.array, reference[k].fc.W.array)
        assert_close(f"{name} piece {k} b", pieces[k].fc.b.array, reference[k].fc.b.array)
        assert not np.allclose(pieces[k].fc.W.array, untrained[k].fc.W.array), "W did not move"
    passed(f"chain_list_{name}")


check("line", line_pieces, line_reference)
check("fan", fan_pieces, fan_reference)

# ---------------------------------------------------------------- only one output piece allowed
probe = MultiNodeChainList(comm)
probe.add_link(L.Linear(2, 2), rank_in=None, rank_out=None)
try:
    probe.add_link(L.Linear(2, 2), rank_in=None, rank_out=None)
except ValueError:
    passed("one_output_piece")
