"""create_multi_node_checkpointer with the multi-node optimizer: save, fail, resume in step, clean up."""

from __future__ import annotations

import pytest

from tests.runtime.chainer_scripts.launch import run_script

CHECKS = [
    "generations kept after a failed run",
    "resumes from the newest iteration every rank has",
    "a finished run removes its checkpoints",
    "nothing to resume from",
]


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [2, 3])
def test_checkpoint_and_resume(n_ranks: int) -> None:
    run_script(n_ranks, "checkpoint_checks.py", CHECKS)


def test_checkpoint_name_is_validated() -> None:
    from mnify.runtime.extensions.checkpoint import create_multi_node_checkpointer

    with pytest.raises(ValueError):
        create_multi_node_checkpointer("a.b", comm=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        create_multi_node_checkpointer("run", comm=object(), cp_interval=0)  # type: ignore[arg-type]
