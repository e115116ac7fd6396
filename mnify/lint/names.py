"""The vocabulary the rules match on: fully qualified names of Chainer, ChainerMN, mnify.runtime,
CuPy, mpi4py and standard-library callables, as ``QualifiedNameProvider`` reports them.

Each set lists the public spelling and, where users import it, the defining submodule, so
``import chainer.links as L``, ``from chainer.links import BatchNormalization as BN`` and
``from chainer.links.normalization.batch_normalization import BatchNormalization`` all match.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_MN_PACKAGES = ("chainermn", "mnify.runtime")


def _multi_node(*paths: str) -> frozenset[str]:
    """``create_communicator`` -> the chainermn and mnify.runtime spellings of that name."""
    return frozenset(f"{pkg}.{path}" for pkg in _MN_PACKAGES for path in paths)


COMMUNICATOR_FACTORIES = _multi_node("create_communicator", "communicators.create_communicator")
MULTI_NODE_OPTIMIZER_FACTORIES = _multi_node(
    "create_multi_node_optimizer", "optimizers.create_multi_node_optimizer"
)
MULTI_NODE_EVALUATOR_FACTORIES = _multi_node(
    "create_multi_node_evaluator",
    "extensions.create_multi_node_evaluator",
    "extensions.multi_node_evaluator.create_multi_node_evaluator",
)
SCATTER_FUNCTIONS = _multi_node(
    "scatter_dataset",
    "scatter_index",
    "datasets.scatter_dataset",
    "datasets.scatter_index",
    "datasets.scatter_dataset.scatter_dataset",
    "datasets.scatter_dataset.scatter_index",
)
EMPTY_DATASET_FACTORIES = _multi_node("create_empty_dataset", "datasets.create_empty_dataset")
# Calls or base classes that make a script model parallel (ranks hold parts of one model and
# see the same batch), where data-parallel completeness rules do not apply.
MODEL_PARALLEL_MARKERS = _multi_node(
    "create_multi_node_iterator",
    "iterators.create_multi_node_iterator",
    "links.ParallelConvolution2D",
    "MultiNodeChainList",
    "links.MultiNodeChainList",
    "links.create_multi_node_n_step_rnn",
    "links.MultiNodeNStepRNN",
    "functions.send",
    "functions.recv",
    "functions.pseudo_connect",
)

BATCH_NORMALIZATION = frozenset(
    {
        "chainer.links.BatchNormalization",
        "chainer.links.normalization.batch_normalization.BatchNormalization",
    }
)
EVALUATOR = frozenset(
    {
        "chainer.training.extensions.Evaluator",
        "chainer.training.extensions.evaluator.Evaluator",
    }
)
TRAINER = frozenset({"chainer.training.Trainer", "chainer.training.trainer.Trainer"})
MULTIPROCESS_ITERATOR = frozenset(
    {
        "chainer.iterators.MultiprocessIterator",
        "chainer.iterators.multiprocess_iterator.MultiprocessIterator",
    }
)
ITERATOR_CLASSES = MULTIPROCESS_ITERATOR | frozenset(
    {
        "chainer.iterators.SerialIterator",
        "chainer.iterators.serial_iterator.SerialIterator",
        "chainer.iterators.MultithreadIterator",
        "chainer.iterators.multithread_iterator.MultithreadIterator",
    }
)

# Extensions that write files or print: they belong on one rank (DESIGN §1, "rank-0 guards").
# The converter guards exactly these (mnify.rewrites.chainer_names), so lint and convert agree.
REPORTING_EXTENSION_NAMES = frozenset(
    {
        "LogReport",
        "PrintReport",
        "ProgressBar",
        "PlotReport",
        "snapshot",
        "Snapshot",
        "snapshot_object",
        "DumpGraph",
        "dump_graph",
        "VariableStatisticsPlot",
    }
)
DUMP_GRAPH_NAMES = frozenset({"DumpGraph", "dump_graph"})
SAVE_FUNCTIONS = frozenset(
    {
        "chainer.serializers.save_npz",
        "chainer.serializers.save_hdf5",
        "chainer.serializers.npz.save_npz",
        "chainer.serializers.hdf5.save_hdf5",
    }
)
_EXTENSIONS_PREFIX = "chainer.training.extensions."

# Calls that return a device object whose ``.use()`` makes it current.
DEVICE_GETTERS = frozenset(
    {
        "chainer.get_device",
        "chainer.backend.get_device",
        "chainer.backends.cuda.get_device_from_id",
        "chainer.backends.cuda.get_device",
        "chainer.backends.cuda.Device",
        "chainer.cuda.get_device_from_id",
        "chainer.cuda.get_device",
        "chainer.cuda.Device",
        "cupy.cuda.Device",
        "chainer.backends.cuda.cupy.cuda.Device",
        "chainer.cuda.cupy.cuda.Device",
    }
)
# Calls that select the current device by themselves.
DEVICE_SETTERS = frozenset(
    {
        "cupy.cuda.runtime.setDevice",
        "chainer.backends.cuda.cupy.cuda.runtime.setDevice",
        "chainer.cuda.cupy.cuda.runtime.setDevice",
    }
)
# Functions that copy to "the current device" unless given one (second argument or device=).
TO_GPU_FUNCTIONS = frozenset({"chainer.backends.cuda.to_gpu", "chainer.cuda.to_gpu"})
# cupy attributes that do not allocate on the current device.
_CUPY_NON_ALLOCATING = frozenset(
    {
        "cuda",
        "get_array_module",
        "asnumpy",
        "fuse",
        "ElementwiseKernel",
        "ReductionKernel",
        "RawKernel",
        "RawModule",
        "get_default_memory_pool",
        "get_default_pinned_memory_pool",
        "is_available",
        "show_config",
        "testing",
        "prof",
    }
)

SUBPROCESS_CALLS = frozenset(
    {
        "subprocess.run",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "subprocess.Popen",
        "subprocess.getoutput",
        "subprocess.getstatusoutput",
        "os.system",
        "os.popen",
        "os.spawnl",
        "os.spawnle",
        "os.spawnlp",
        "os.spawnlpe",
        "os.spawnv",
        "os.spawnve",
        "os.spawnvp",
        "os.spawnvpe",
        "os.posix_spawn",
        "os.posix_spawnp",
    }
)
FORK_CALLS = frozenset({"os.fork", "os.forkpty", "pty.fork"})
START_METHOD_SETTERS = frozenset({"multiprocessing.set_start_method"})
START_METHOD_CONTEXTS = frozenset({"multiprocessing.get_context"})
PROCESS_FACTORIES = frozenset(
    {
        "multiprocessing.Process",
        "multiprocessing.Pool",
        "multiprocessing.pool.Pool",
        "multiprocessing.context.Process",
        "concurrent.futures.ProcessPoolExecutor",
        "concurrent.futures.process.ProcessPoolExecutor",
    }
)
PROCESS_CLASS = frozenset({"multiprocessing.Process", "multiprocessing.context.Process"})
PROCESS_EXITS = frozenset({"sys.exit", "builtins.exit", "builtins.quit", "os._exit", "os.abort"})

# Communicator methods every rank must call together (ChainerMN, mnify.runtime and mpi4py).
COLLECTIVE_METHODS = frozenset(
    {
        "barrier",
        "Barrier",
        "bcast",
        "Bcast",
        "bcast_obj",
        "bcast_data",
        "gather",
        "Gather",
        "Gatherv",
        "gather_obj",
        "allgather",
        "Allgather",
        "Allgatherv",
        "allgather_obj",
        "allreduce",
        "Allreduce",
        "allreduce_obj",
        "all_reduce",
        "alltoall",
        "Alltoall",
        "scatter",
        "Scatter",
        "Scatterv",
        "scatter_obj",
        "reduce",
        "Reduce",
        "reduce_scatter",
        "Reduce_scatter",
        "multi_node_mean_grad",
        "split",
        "Split",
    }
)
BARRIER_METHODS = frozenset({"barrier", "Barrier"})
SPLIT_METHODS = frozenset({"split", "Split", "Split_type", "Create", "Create_group"})

# Builtins that are cheap bookkeeping, not "work" that makes one rank late.
CHEAP_BUILTINS = frozenset(
    f"builtins.{name}"
    for name in (
        "print len str int float bool dict list set tuple range enumerate zip sorted min max "
        "sum abs round isinstance getattr setattr hasattr format repr type map filter any all"
    ).split()
)
CHEAP_METHODS = frozenset(
    {
        "extend",
        "append",
        "format",
        "join",
        "info",
        "debug",
        "warning",
        "warn",
        "get",
        "items",
        "flush",
        "write",
    }
)

RANK_ATTRIBUTES = {"rank": "global", "intra_rank": "intra", "inter_rank": "inter"}
SIZE_ATTRIBUTES = frozenset({"size", "intra_size", "inter_size"})
MPI_WORLD = frozenset({"mpi4py.MPI.COMM_WORLD"})
# Launcher environment variables: global rank vs node-local rank.
_LOCAL_RANK_ENV = re.compile(r"LOCAL_RANK|LOCALRANK|LOCAL_ID")
_GLOBAL_RANK_ENV = re.compile(r"(^|_)RANK$|PMI_RANK|PMIX_RANK")
_COMM_NAME = re.compile(r"^(comm|communicator|mpi_comm|world|\w+_comm|comm_\w+)$")

TRAINING_MODULES = ("chainer", "chainermn", "mnify.runtime", "cupy", "mpi4py")


def is_training_module(name: str) -> bool:
    """``name`` is (a submodule of) one of ``TRAINING_MODULES``."""
    return any(name == root or name.startswith(root + ".") for root in TRAINING_MODULES)


def any_in(names: Iterable[str], wanted: frozenset[str]) -> bool:
    """True when one of ``names`` is in ``wanted``."""
    return any(name in wanted for name in names)


def is_reporting_extension(name: str) -> bool:
    return name.startswith(_EXTENSIONS_PREFIX) and name.rsplit(".", 1)[1] in (
        REPORTING_EXTENSION_NAMES
    )


def is_dump_graph(name: str) -> bool:
    return name.startswith(_EXTENSIONS_PREFIX) and name.rsplit(".", 1)[1] in DUMP_GRAPH_NAMES


def is_extension(name: str) -> bool:
    return name.startswith(_EXTENSIONS_PREFIX)


def is_optimizer_class(name: str) -> bool:
    """``chainer.optimizers.Adam`` (or ``chainer.optimizers.adam.Adam``): a concrete optimizer."""
    if not name.startswith("chainer.optimizers."):
        return False
    last = name.rsplit(".", 1)[1]
    return last[:1].isupper() and not last.endswith(("Hook", "Rule"))


def is_dataset_factory(name: str) -> bool:
    """Anything from ``chainer.datasets`` (``get_mnist``, ``TupleDataset``, ...)."""
    return name.startswith("chainer.datasets.")


def is_cupy_allocation(name: str) -> bool:
    """A CuPy call that allocates on the current device (``cupy.zeros``, ``cuda.cupy.array``)."""
    parts = name.split(".")
    if "cupy" not in parts:
        return False
    rest = parts[parts.index("cupy") + 1 :]
    return bool(rest) and rest[0] not in _CUPY_NON_ALLOCATING


def env_rank_kind(key: str) -> str | None:
    """Rank kind named by a launcher environment variable (``OMPI_COMM_WORLD_LOCAL_RANK``...)."""
    upper = key.upper()
    if _LOCAL_RANK_ENV.search(upper):
        return "intra"
    if _GLOBAL_RANK_ENV.search(upper):
        return "global"
    return None


def looks_like_communicator(identifier: str) -> bool:
    """Naming convention for communicators passed around as parameters (``comm``, ``self.comm``)."""
    return bool(_COMM_NAME.match(identifier))
