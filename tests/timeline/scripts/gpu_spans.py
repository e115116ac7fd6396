"""pure_nccl with the timeline on, on the CPU stand-in for CuPy and NCCL (tests/support/fakecupy,
first on sys.path; the CUDA kernels replaced by their numpy twins). Prints ``PASS gpu spans``."""

from __future__ import annotations

from tests.support import fakecupy

fakecupy.use()

import cupy  # noqa: E402
import mnify_fake_device  # noqa: E402, F401

from mnify.runtime import observers  # noqa: E402
from mnify.runtime.communicators import create_communicator  # noqa: E402
from tests.support.rank_checks import passed  # noqa: E402


class Param:
    def __init__(self, n: int) -> None:
        self.data = cupy.asarray([1.0] * n).astype("float32")
        self.grad = cupy.asarray([2.0] * n).astype("float32")


class Model:
    def __init__(self) -> None:
        self.params = {f"p{i}": Param(n) for i, n in enumerate([3, 50, 7])}

    def namedparams(self) -> list[tuple[str, Param]]:
        return list(self.params.items())


def main() -> None:
    comm = create_communicator("pure_nccl")
    model = Model()
    for _ in range(3):
        observers.update_begins(None)
        comm.multi_node_mean_grad(model)
        observers.apply_begins(None)
        observers.update_ends(None)
    comm.barrier()
    passed("gpu spans")


if __name__ == "__main__":
    main()
