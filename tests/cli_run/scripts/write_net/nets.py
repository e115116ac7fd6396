"""The model of the write net's training script: a method that writes through
``json.dump(..., open(path, "w"))``, defined away from the script that calls it after training
(a write the converter cannot see from train.py)."""

import json

import chainer
import chainer.functions as F
import chainer.links as L


class MLP(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(8, n_units)
            self.l2 = L.Linear(n_units, n_out)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))

    def save_structure(self, path):
        structure = {name: list(param.shape) for name, param in self.namedparams()}
        json.dump(structure, open(path, "w"))
