"""Seed 000's watchdog scenario on mnify.runtime: rank-divergent work, then the training loop's
all_reduce with no barrier in between (a slow rank 0 trips the watchdog on the others)."""

from mnify import runtime as mn


def train(data_iterator, grads, preprocess, wait_for_data):
    comm = mn.create_communicator("naive")
    if comm.rank == 0:
        preprocess()
    if comm.rank != 0:
        wait_for_data()
    for _ in data_iterator():
        comm.all_reduce(grads)  # expect: MN302


def train_synchronised(data_iterator, grads, preprocess):
    comm = mn.create_communicator("naive")
    if comm.rank == 0:
        preprocess()
    comm.barrier()
    for _ in data_iterator():
        comm.all_reduce(grads)
