"""Rank script: an MLP split layer-wise with MultiNodeChainList trains like the whole MLP.

Every rank builds only its pieces; stage k's layer is created right after ``np.random.seed(k)``
wherever it lives, and the single-process reference builds the same layers the same way. After
a few SGD steps on the same batches, each rank's layers must equal the reference's.

2 ranks: rank 0 runs stage 0 and sends to rank 1, which runs stage 1 and sends back; rank 0 then
runs stage 2 and produces the output (a delegate threaded into a recv, and two pieces on one
rank). 3 ranks: a pipeline 0 -> 1 -> 2 with the output on rank 2.
Prints ``CHECK <name> ok`` per check and ``DONE``.
"""

from __future__ import annotations

from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify.runtime.links import MultiNodeChainList
from tests.model_parallel.rank_common import assert_close, make_comm

comm = make_comm()
rank, size = comm.rank, comm.size
SIZES = [(6, 8), (8, 7), (7, 3)]  # stage k: Linear(*SIZES[k])


class Stage(chainer.Chain):
    def __init__(self, k: int) -> None:
        super().__init__()
        np.random.seed(k)
        with self.init_scope():
            self.fc = L.Linear(*SIZES[k])
        self.last = k == len(SIZES) - 1

    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        return h if self.last else F.tanh(h)


def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1000 + step)
    return rng.normal(size=(8, 6)).astype(np.float32), rng.randint(0, 3, 8).astype(np.int32)


# ---------------------------------------------------------------- the split model on this rank
model = MultiNodeChainList(comm)
owned: dict[int, Stage] = {}  # stage index -> this rank's copy
if size == 2:
    if rank == 0:
        owned[0], owned[2] = Stage(0), Stage(2)
        model.add_link(owned[0], rank_in=None, rank_out=1)
        model.add_link(owned[2], rank_in=1, rank_out=None)
    else:
        owned[1] = Stage(1)
        model.add_link(owned[1], rank_in=0, rank_out=0)
    output_rank = 0
else:
    stage = Stage(rank) if rank < 3 else None
    if stage is not None:
        owned[rank] = stage
        model.add_link(
            stage, rank_in=None if rank == 0 else rank - 1, rank_out=None if rank == 2 else rank + 1
        )
    output_rank = 2

optimizer = chainer.optimizers.SGD(lr=0.2)
optimizer.setup(model)


def lossfun(x: np.ndarray, t: np.ndarray) -> chainer.Variable:
    out = model(x)
    if rank == output_rank:
        return F.softmax_cross_entropy(out, t)
    assert isinstance(out, chainer.Variable) and out.size == 0, "expected a delegate variable"
    return out


for step in range(4):
    x, t = batches(step)
    if rank < 3:
        optimizer.update(lossfun, x, t)

# ---------------------------------------------------------------- single-process reference
stages = [Stage(k) for k in range(len(SIZES))]
reference = chainer.ChainList(*stages)
ref_opt = chainer.optimizers.SGD(lr=0.2)
ref_opt.setup(reference)


def ref_loss(x: np.ndarray, t: np.ndarray) -> chainer.Variable:
    h = x
    for s in stages:
        h = s(h)
    return F.softmax_cross_entropy(h, t)


for step in range(4):
    ref_opt.update(ref_loss, *batches(step))

for k, mine in owned.items():
    assert_close(f"stage {k} W", mine.fc.W.array, stages[k].fc.W.array)
    assert_close(f"stage {k} b", mine.fc.b.array, stages[k].fc.b.array)
    assert not np.allclose(mine.fc.W.array, Stage(k).fc.W.array), "training did not move W"
ok_name = "chain_list_two_ranks_round_trip" if size == 2 else "chain_list_pipeline"
print(f"CHECK {ok_name} ok", flush=True)

# ---------------------------------------------------------------- only one output piece allowed
probe = MultiNodeChainList(comm)
probe.add_link(L.Linear(2, 2), rank_in=None, rank_out=None)
try:
    probe.add_link(L.Linear(2, 2), rank_in=None, rank_out=None)
except ValueError:
    print("CHECK one_output_piece ok", flush=True)

print("DONE", flush=True)
