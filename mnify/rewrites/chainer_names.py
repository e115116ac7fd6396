"""The Chainer names the rewrites recognise, matched on resolved qualified names.

Matching is on the resolved name, so ``import chainer.links as L``, ``from chainer import links``
and ``from chainer.links import BatchNormalization as BN`` all reach the same rule. Chainer also
exposes classes under their defining module (``chainer.links.normalization.batch_normalization
.BatchNormalization``), so a name matches on its package prefix and its last component.
"""

from __future__ import annotations

from mnify.lint.names import REPORTING_EXTENSION_NAMES


def last(qname: str) -> str:
    return qname.rsplit(".", 1)[-1]


def under(qname: str, package: str) -> bool:
    return qname == package or qname.startswith(package + ".")


def is_link(qname: str, name: str) -> bool:
    return under(qname, "chainer.links") and last(qname) == name


_NOT_OPTIMIZERS = {"Optimizer", "GradientMethod", "UpdateRule", "Hyperparameter"}


def is_optimizer(qname: str) -> bool:
    name = last(qname)
    return (
        under(qname, "chainer.optimizers")
        and name[:1].isupper()
        and name not in _NOT_OPTIMIZERS
        and qname.count(".") <= 3
    )


ITERATORS = {"SerialIterator", "MultiprocessIterator", "MultithreadIterator", "DaliIterator"}


def is_iterator(qname: str) -> bool:
    return under(qname, "chainer.iterators") and last(qname) in ITERATORS


def is_multiprocess_iterator(qname: str) -> bool:
    return under(qname, "chainer.iterators") and last(qname) == "MultiprocessIterator"


def is_extension(qname: str, *names: str) -> bool:
    return under(qname, "chainer.training.extensions") and last(qname) in names


# Extensions that write files or the terminal: rank 0 only (DESIGN.md section 1, rank-0 guards);
# one list with lint's MN401, so what lint flags is what convert guards.
WRITER_EXTENSIONS = tuple(sorted(REPORTING_EXTENSION_NAMES))


def is_trainer(qname: str) -> bool:
    return under(qname, "chainer.training") and last(qname) == "Trainer"


def is_serializer_save(qname: str) -> bool:
    return under(qname, "chainer.serializers") and last(qname).startswith("save_")


def is_early_stopping(qname: str) -> bool:
    return under(qname, "chainer.training.triggers") and last(qname) == "EarlyStoppingTrigger"


# Device idioms across Chainer versions; the argument is the device id or spec.
DEVICE_FUNCTIONS = {
    "chainer.get_device",
    "chainer.backend.get_device",
    "chainer.cuda.get_device_from_id",
    "chainer.backends.cuda.get_device_from_id",
    "chainer.cuda.get_device",
    "chainer.backends.cuda.get_device",
    "cupy.cuda.Device",
    "chainer.backends.cuda.Device",
    "chainer.cuda.Device",
}

# Library models that contain BatchNormalization (for create_mnbn_model at the call site).
BN_LIBRARY_MODELS = {
    "ResNet50Layers",
    "ResNet101Layers",
    "ResNet152Layers",
    "GoogLeNet",
}

FORK_HAZARDS = {
    "subprocess": "starts child processes",
    "os.system": "forks a shell",
    "os.popen": "forks a shell",
    "os.fork": "forks the MPI process",
    "multiprocessing": "forks the MPI process",
}


def fork_hazard(qname: str) -> str | None:
    """Why a call is a fork hazard under MPI, or None."""
    for prefix, why in FORK_HAZARDS.items():
        if under(qname, prefix):
            return why
    if is_extension(qname, "DumpGraph", "dump_graph"):
        return "was seen to crash Open MPI 2 jobs with signal 6 (seed 002)"
    return None
