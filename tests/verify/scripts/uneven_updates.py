"""Wrong: the ranks update a different number of times (rank 0 five updates of its own model,
the others one, then they idle), so rank 0 reaches the verification stop and the others never
do. Nothing averages the gradients, so no collective hangs first: the stop's timeout must end
the job, naming a rank that did not arrive."""

import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn

comm = mn.create_communicator("naive")
model = L.Linear(3, 2)
optimizer = chainer.optimizers.SGD(0.1)
optimizer.setup(model)
x = np.ones((4, 3), dtype=np.float32)
for _ in range(5 if comm.rank == 0 else 1):
    model.cleargrads()
    F.sum(model(x)).backward()
    optimizer.update()
time.sleep(120)
