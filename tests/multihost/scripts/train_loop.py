"""Rank script: a training loop's communication pattern, for fault injection on the test bed.

Usage: ``train_loop.py STEPS FLOATS [PAUSE]``. Each step averages a fake model's gradients
(``FLOATS`` float32 values in three arrays) with ``create_communicator('auto')``
(two_dimensional across equally crowded hosts, hierarchical across uneven ones), checks the
mean, prints ``STEP k <seconds>`` and sleeps ``PAUSE`` seconds (the "compute"). Ends with
``DONE``. Every rank prints, so the test sees which hosts are alive.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from mnify import runtime as mn


class Param:
    def __init__(self, grad: np.ndarray) -> None:
        self.data = np.zeros_like(grad)
        self.grad = grad


class Model:
    def __init__(self, floats: int, rank: int) -> None:
        third = max(1, floats // 3)
        self.params = {
            f"w{i}": Param(np.full(third + i, rank + 1, dtype=np.float32)) for i in range(3)
        }

    def namedparams(self) -> list[tuple[str, Param]]:
        return list(self.params.items())


def main() -> None:
    steps, floats = int(sys.argv[1]), int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    comm = mn.create_communicator("auto")
    want = (comm.size + 1) / 2  # mean of 1..size
    print(f"START {comm.name} host {comm.host_name} rank {comm.rank}", flush=True)
    for step in range(steps):
        model = Model(floats, comm.rank)
        began = time.perf_counter()
        comm.multi_node_mean_grad(model)
        took = time.perf_counter() - began
        for _, p in model.namedparams():
            assert np.allclose(p.grad, want), (step, p.grad[:3], want)
        print(f"STEP {step} {took:.3f}", flush=True)
        if pause:
            time.sleep(pause)
    comm.finalize()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
