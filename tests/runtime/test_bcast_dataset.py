"""``mn.datasets.bcast_dataset``: the whole dataset on every rank, array datasets once per host."""

from __future__ import annotations

import pytest

from tests.runtime.chainer_scripts.launch import run_script

pytestmark = pytest.mark.mpi

CHECKS = [
    "a TupleDataset of arrays: rank 0's, read-only, one file per host",
    "one array",
    "any other dataset: the pickle broadcast",
]


def test_bcast_dataset_on_two_hosts() -> None:
    run_script(3, "bcast_dataset_checks.py", CHECKS, extra_env={"MNIFY_TEST_HOSTS": "0,0,1"})
