"""``mnify convert --data global`` of the bundled example trains like one process, at any size.

examples/mnist/train_mnist.py converted with ``--data global`` (weak scaling: the global batch is
``--batchsize`` times the ranks) runs on 2 ranks at ``--batchsize 16`` and, the same converted
script, in one process at ``--batchsize 32``: the same global batch of the same seeded schedule,
so in float64 the final parameters agree to rounding (docs/global_batch.md). The 2-rank run's
epoch-1 snapshot (``mn.extensions.global_snapshot``) is then resumed by one process, which must
end at the same parameters: the run resumes at another number of ranks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnify.converter import ConvertOptions, convert_sources
from tests.support.mpirun import REPO, mpi_env, run_ranks

pytestmark = pytest.mark.mpi

EXAMPLE = REPO / "examples" / "mnist" / "train_mnist.py"
FLOAT64 = {"CHAINER_DTYPE": "float64"}
# 96 examples, global batch 32: 3 updates an epoch, snapshots after each epoch
ARGS = ["--device", "-1", "--synthetic", "96", "--epoch", "2", "--frequency", "1", "--unit", "16"]
ARGS += ["--noplot", "--out", "result"]


def _parameters(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files if "/predictor/" in k and "optimizer" not in k}


def _single(script: Path, cwd: Path, *extra: str) -> None:
    cwd.mkdir()
    subprocess.run(
        [sys.executable, str(script), *ARGS, "--batchsize", "32", *extra],
        cwd=cwd,
        env=mpi_env(FLOAT64),
        check=True,
        capture_output=True,
        timeout=240,
    )


def _assert_same(many: dict[str, np.ndarray], one: dict[str, np.ndarray]) -> None:
    assert many.keys() == one.keys() and one
    for key in one:
        assert one[key].dtype == np.float64, key
        np.testing.assert_allclose(many[key], one[key], rtol=1e-10, atol=0, err_msg=key)


def test_bundled_example_with_global_data_equals_one_process(tmp_path: Path) -> None:
    (result,) = convert_sources({str(EXAMPLE): EXAMPLE.read_text()}, ConvertOptions(data="global"))
    assert result.output is not None, result.error
    script = tmp_path / "train_mnist_mn.py"
    script.write_text(result.output, encoding="utf-8")

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    run_ranks(2, script, [*ARGS, "--batchsize", "16"], env=FLOAT64, cwd=ranks, timeout=240)
    _single(script, tmp_path / "one")
    final = "snapshot_iter_6"
    _assert_same(
        _parameters(ranks / "result" / final), _parameters(tmp_path / "one" / "result" / final)
    )
    # the 2-rank run's snapshot after epoch 1, resumed by one process: the same end
    _single(script, tmp_path / "resumed", "--resume", str(ranks / "result" / "snapshot_iter_3"))
    _assert_same(
        _parameters(tmp_path / "resumed" / "result" / final),
        _parameters(tmp_path / "one" / "result" / final),
    )
