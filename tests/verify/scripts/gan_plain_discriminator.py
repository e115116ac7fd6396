"""Wrong: a GAN whose generator optimizer was made multi-node but whose discriminator optimizer
was forgotten (a plain Chainer optimizer): each rank's discriminator drifts on its own data."""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn


class Generator(chainer.Chain):
    def __init__(self, n_hidden=8):
        super().__init__()
        self.n_hidden = n_hidden
        with self.init_scope():
            self.l0 = L.Linear(n_hidden, 32)
            self.l1 = L.Linear(32, 2)

    def make_hidden(self, batchsize):
        return np.random.uniform(-1, 1, (batchsize, self.n_hidden)).astype(np.float32)

    def forward(self, z):
        return self.l1(F.relu(self.l0(z)))


class Discriminator(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l0 = L.Linear(2, 32)
            self.l1 = L.Linear(32, 1)

    def forward(self, x):
        return self.l1(F.leaky_relu(self.l0(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batchsize", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=100)
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    gen, dis = Generator(), Discriminator()
    opt_gen = mn.create_multi_node_optimizer(chainer.optimizers.Adam(2e-4, beta1=0.5), comm)
    opt_gen.setup(gen)
    opt_dis = chainer.optimizers.Adam(2e-4, beta1=0.5)
    opt_dis.setup(dis)

    real = None
    if comm.rank == 0:
        real = np.random.RandomState(0).randn(512, 2).astype(np.float32)
    real = mn.scatter_dataset(real, comm, shuffle=True)
    it = chainer.iterators.SerialIterator(real, args.batchsize)
    for _ in range(args.iterations):
        x_real = np.stack(it.next())
        z = gen.make_hidden(args.batchsize)
        x_fake = gen(z)
        y_real, y_fake = dis(x_real), dis(x_fake)
        loss_dis = F.mean(F.softplus(-y_real)) + F.mean(F.softplus(y_fake))
        loss_gen = F.mean(F.softplus(-y_fake))
        dis.cleargrads()
        loss_dis.backward()
        opt_dis.update()
        gen.cleargrads()
        loss_gen.backward()
        opt_gen.update()


if __name__ == "__main__":
    main()
