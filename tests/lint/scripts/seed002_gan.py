"""The bugs seed 002's author hit in a ChainerMN GAN script: the GPU chosen by global rank
(fails with 2 nodes x 4 GPUs) and DumpGraph forking under Open MPI (signal 6)."""

import chainer
import chainermn
from chainer import training
from chainer.training import extensions


def make_optimizer(model, comm, alpha=0.0002, beta1=0.5):
    optimizer = chainermn.create_multi_node_optimizer(
        chainer.optimizers.Adam(alpha=alpha, beta1=beta1), comm
    )
    optimizer.setup(model)
    return optimizer


def main(gen, dis, updater_class):
    comm = chainermn.create_communicator("pure_nccl")
    devices = comm.rank  # expect: MN103
    chainer.cuda.get_device(devices).use()
    gen.to_gpu()
    dis.to_gpu()
    opt_gen = make_optimizer(gen, comm)
    opt_dis = make_optimizer(dis, comm)
    if comm.rank == 0:
        train = chainer.datasets.get_cifar10(withlabel=False, scale=255.0)[0]
    else:
        train = None
    train = chainermn.scatter_dataset(train, comm, shuffle=True)
    train_iter = chainer.iterators.SerialIterator(train, 64)
    updater = updater_class(
        models=(gen, dis), iterator=train_iter, optimizer={"gen": opt_gen, "dis": opt_dis}
    )
    trainer = training.Trainer(updater, (100, "epoch"), out="result")
    if comm.rank == 0:
        trainer.extend(extensions.snapshot_object(gen, "gen_iter_{.updater.iteration}.npz"))
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.DumpGraph("loss_dis", filename="dis.dot"))  # expect: MN201
    trainer.run()
