"""Right: a hand-written loop. The arrays are split by hand (x[rank::size]), the model has
dropout (random per rank), gradients are averaged by the multi-node optimizer."""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

from mnify import runtime as mn


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.fc1 = L.Linear(16, 32)
            self.fc2 = L.Linear(32, 4)

    def __call__(self, x):
        h = F.dropout(F.relu(self.fc1(x)), ratio=0.5)
        return self.fc2(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    comm = mn.create_communicator("naive")
    data = np.random.RandomState(1).randn(4000, 16).astype(np.float32)
    labels = np.random.RandomState(2).randint(0, 4, 4000).astype(np.int32)
    x_train, y_train = data[comm.rank :: comm.size], labels[comm.rank :: comm.size]

    net = Net()
    opt = mn.create_multi_node_optimizer(chainer.optimizers.SGD(lr=0.01), comm)
    opt.setup(net)
    for it in range(args.iterations):
        idx = np.random.choice(len(x_train), args.batch, replace=False)
        loss = F.softmax_cross_entropy(net(x_train[idx]), y_train[idx])
        net.cleargrads()
        loss.backward()
        opt.update()
        if comm.rank == 0 and it % 10 == 0:
            print(f"iteration {it} loss {float(loss.array):.4f}")


if __name__ == "__main__":
    main()
