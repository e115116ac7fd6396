"""What mnify knows about Chainer, ChainerMN and its own runtime: pure data, read by lint, the
rewrites and the report alike, so the two halves of the tool can never disagree.

Names are fully qualified as libcst's ``QualifiedNameProvider`` reports them. Chainer exposes
classes both under their package and their defining module (``chainer.links.BatchNormalization``
and ``chainer.links.normalization.batch_normalization.BatchNormalization``), so most predicates
match on a package prefix and the last component. Nothing here imports libcst, Chainer, CuPy or
mpi4py; the runtime never imports this module (its collectives are marked on the communicator
classes, and a test holds the two lists together).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

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
# The global batch's collectives (docs/global_batch.md): every rank builds the iterator together
# (one allgather compares the datasets), and receives rank 0's dataset together.
GLOBAL_BATCH_COLLECTIVES = {
    qname: what
    for what, paths in (
        (
            "create_global_batch_iterator",
            (
                "create_global_batch_iterator",
                "iterators.create_global_batch_iterator",
                "iterators.global_batch_iterator.create_global_batch_iterator",
            ),
        ),
        (
            "bcast_dataset",
            ("bcast_dataset", "datasets.bcast_dataset", "datasets.bcast_dataset.bcast_dataset"),
        ),
    )
    for qname in _multi_node(*paths)
}
# Calls or base classes that make a script model parallel (ranks hold parts of one model and
# see the same batch), where data-parallel completeness rules do not apply.
MODEL_PARALLEL_MARKERS = _multi_node(
    "create_multi_node_iterator",
    "iterators.create_multi_node_iterator",
    "links.ParallelConvolution2D",
    "links.create_spatial_parallel_model",
    "MultiNodeChainList",
    "links.MultiNodeChainList",
    "links.create_multi_node_n_step_rnn",
    "links.MultiNodeNStepRNN",
    "functions.send",
    "functions.recv",
    "functions.pseudo_connect",
)


# Extensions that write files or print: they belong on one rank (docs/design.md §1, "rank-0 guards").
# Lint's MN401 flags and the converter guards exactly these.
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
# The device getters that take any Chainer device specifier (``'@cupy:0'``, ``'@numpy'``, ``-1``);
# the others take a GPU id only.
SPEC_DEVICE_GETTERS = frozenset({"chainer.get_device", "chainer.backend.get_device"})
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
# argparse destinations of the flags scripts select their device with (``--gpu``, ``-g``,
# ``--gpus``, ``--gpu-device``, ``--gpu_id``, ``--device``), most specific first. A flag whose
# value the script passes as a device (``get_device_from_id(args.X)``, ``device=args.X``)
# counts whatever its name.
DEVICE_FLAG_DESTS = (
    "gpu",
    "gpus",
    "gpu_device",
    "gpu_devices",
    "gpu_id",
    "gpu_ids",
    "gpuid",
    "g",
    "device",
    "devices",
    "device_id",
)
# Device specifier of CuPy GPU N in Chainer 7 (``chainer.get_device('@cupy:0')``), for ``%``.
CUPY_DEVICE_SPEC = "@cupy:%d"
# The communicator a GPU run gets; a CPU run's depends on the target: ChainerMN's ``flat``
# packs gradients in GPU memory, so CPU runs of ChainerMN need ``naive``; mnify's ``flat``
# packs in host memory and is measured faster than its ``naive`` (bench/allreduce.py).
GPU_COMMUNICATOR = "pure_nccl"
CPU_COMMUNICATORS = {"mnify": "flat", "chainermn": "naive"}


def cpu_communicator(target: str) -> str:
    """The communicator a CPU run gets under ``--target`` (docs/design.md §1)."""
    return CPU_COMMUNICATORS.get(target, CPU_COMMUNICATORS["mnify"])


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
        "allreduce_grad",
        "broadcast_data",
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
        # writing a row through csv.writer/DictWriter, closing a file
        "writerow",
        "writerows",
        "writeheader",
        "close",
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


def any_is(names: Iterable[str], predicate: Callable[[str], bool]) -> bool:
    """True when one of ``names`` satisfies ``predicate`` (``any_is(names, is_trainer)``)."""
    return any(predicate(name) for name in names)


def is_reporting_extension(name: str) -> bool:
    """An extension that writes files or the terminal: rank 0 only (docs/design.md §1, rank-0 guards)."""
    return is_extension(name, *REPORTING_EXTENSION_NAMES)


def is_dump_graph(name: str) -> bool:
    return is_extension(name, *DUMP_GRAPH_NAMES)


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


# ------------------------------------------------------------------------- name helpers
def last(qname: str) -> str:
    """The last component of a dotted name."""
    return qname.rsplit(".", 1)[-1]


def under(qname: str, package: str) -> bool:
    """``qname`` is ``package`` or lives inside it."""
    return qname == package or qname.startswith(package + ".")


def is_runtime_name(qname: str, *paths: str) -> bool:
    """``chainermn.X`` or ``mnify.runtime.X`` (or any submodule spelling of X) for X in paths."""
    bare = qname.lstrip(".")
    return any(under(bare, pkg) for pkg in _MN_PACKAGES) and last(bare) in {last(p) for p in paths}


# ------------------------------------------------------------------------- Chainer classes
def is_link(qname: str, name: str) -> bool:
    """A ``chainer.links`` class by its last name (any submodule spelling)."""
    return under(qname, "chainer.links") and last(qname) == name


_NOT_OPTIMIZERS = frozenset({"Optimizer", "GradientMethod", "UpdateRule", "Hyperparameter"})


def is_optimizer(qname: str) -> bool:
    """A concrete optimizer (``chainer.optimizers.Adam``, ``chainer.optimizers.adam.Adam``);
    not its update rule (``AdamRule``), hooks or base classes."""
    name = last(qname)
    return (
        under(qname, "chainer.optimizers")
        and name[:1].isupper()
        and not name.endswith(("Hook", "Rule"))
        and name not in _NOT_OPTIMIZERS
        and qname.count(".") <= 3
    )


# Chainer's base classes of optimizers: a class deriving from one (``class Eve(GradientMethod)``)
# is an optimizer, though neither is one to build
OPTIMIZER_BASES = frozenset(
    {
        "chainer.Optimizer",
        "chainer.GradientMethod",
        "chainer.optimizer.Optimizer",
        "chainer.optimizer.GradientMethod",
    }
)


ITERATOR_NAMES = frozenset(
    {"SerialIterator", "MultiprocessIterator", "MultithreadIterator", "DaliIterator"}
)


def is_iterator(qname: str) -> bool:
    """One of Chainer's dataset iterators."""
    return under(qname, "chainer.iterators") and last(qname) in ITERATOR_NAMES


def is_multiprocess_iterator(qname: str) -> bool:
    return under(qname, "chainer.iterators") and last(qname) == "MultiprocessIterator"


def is_trainer(qname: str) -> bool:
    return under(qname, "chainer.training") and last(qname) == "Trainer"


def is_evaluator(qname: str) -> bool:
    return is_extension(qname, "Evaluator")


def is_batch_normalization(qname: str) -> bool:
    return is_link(qname, "BatchNormalization")


def is_serializer_save(qname: str) -> bool:
    """``chainer.serializers.save_npz`` / ``save_hdf5`` (any submodule spelling)."""
    return under(qname, "chainer.serializers") and last(qname).startswith("save_")


def is_early_stopping(qname: str) -> bool:
    return under(qname, "chainer.training.triggers") and last(qname) == "EarlyStoppingTrigger"


def is_extension(qname: str, *names: str) -> bool:
    """A ``chainer.training.extensions`` name; with ``names``, one of those."""
    return under(qname, "chainer.training.extensions") and (not names or last(qname) in names)


# ------------------------------------------------------------------------- batch and lr
# Extensions that change an optimizer hyperparameter over time (the learning rate, usually).
LR_SHIFT_EXTENSIONS = frozenset(
    {
        "ExponentialShift",
        "LinearShift",
        "PolynomialShift",
        "StepShift",
        "MultistepShift",
        "WarmupShift",
        "InverseShift",
    }
)
# Shifts that count their own calls (one per iteration by default) whatever the trigger unit.
ITERATION_COUNTING_SHIFTS = LR_SHIFT_EXTENSIONS - {"ExponentialShift", "InverseShift"}
# Optimizers whose learning rate is the hyperparameter ``alpha`` (the Adam family; RMSprop's
# ``alpha`` is a decay rate, its learning rate is ``lr``) and those that have none.
ALPHA_OPTIMIZERS = frozenset({"Adam", "AdamW", "AMSGrad", "AdaBound", "AMSBound"})
NO_LR_OPTIMIZERS = frozenset({"AdaDelta"})
EXTENSIONS_MODULE = "chainer.training.extensions"
BUILTIN_PRINT = "builtins.print"


def is_lr_shift(qname: str) -> bool:
    return is_extension(qname, *LR_SHIFT_EXTENSIONS)


def lr_hyperparameter(qname: str) -> str | None:
    """The hyperparameter an optimizer's constructor takes as its learning rate (None: none)."""
    name = last(qname)
    if name in NO_LR_OPTIMIZERS:
        return None
    return "alpha" if name in ALPHA_OPTIMIZERS else "lr"


def is_functions_sum(qname: str) -> bool:
    """``chainer.functions.sum`` (``F.sum``), any submodule spelling."""
    return under(qname, "chainer.functions") and last(qname) == "sum"


# Library models that contain BatchNormalization (wrapped with create_mnbn_model where built).
BN_LIBRARY_MODELS = frozenset({"ResNet50Layers", "ResNet101Layers", "ResNet152Layers", "GoogLeNet"})

# Trainer updaters that drive several GPUs from one process (a person must choose one per rank).
MULTI_GPU_UPDATERS = frozenset({"ParallelUpdater", "MultiprocessParallelUpdater"})


def is_multi_gpu_updater(qname: str) -> bool:
    return under(qname, "chainer.training") and last(qname) in MULTI_GPU_UPDATERS


def is_standard_updater(qname: str) -> bool:
    """Chainer's ``StandardUpdater`` (whose step ``GrowBatch`` can cut into micro-batches)."""
    return under(qname, "chainer.training") and last(qname) == "StandardUpdater"


def is_library_bn_model(qname: str) -> bool:
    """A model Chainer ships that holds BatchNormalization (``L.ResNet50Layers``)."""
    return under(qname, "chainer.links") and last(qname) in BN_LIBRARY_MODELS


def is_transform_dataset(qname: str) -> bool:
    return under(qname, "chainer.datasets") and last(qname) == "TransformDataset"


# Chainer's datasets that hold paths and read a file when indexed: building one is cheap
LAZY_DATASETS = frozenset(
    {"LabeledImageDataset", "ImageDataset", "ZippedImageDataset", "MultiZippedImageDataset"}
)


def is_lazy_dataset(qname: str) -> bool:
    """A Chainer dataset that reads its examples from files when indexed."""
    return under(qname, "chainer.datasets") and last(qname) in LAZY_DATASETS


def is_dataset_mixin(qname: str) -> bool:
    """``chainer.dataset.DatasetMixin`` (a user's dataset class derives from it)."""
    return last(qname) == "DatasetMixin" and under(qname, "chainer")


# calls that change where imports look or import a module by name (a dataset class found so
# exists only in the process that ran them)
IMPORT_PATH_CHANGES = frozenset(
    {
        "sys.path.insert",
        "sys.path.append",
        "sys.path.extend",
        "importlib.import_module",
        "builtins.__import__",
        "__import__",
        "imp.load_source",
        "importlib.util.spec_from_file_location",
        "importlib.machinery.SourceFileLoader",
        "runpy.run_path",
    }
)


def is_link_name(qname: str) -> bool:
    """Anything in ``chainer.links`` (a layer constructor: allocation, not work)."""
    return under(qname, "chainer.links")


# Roots whose names the converter prefers when a call resolves to several (an import of a
# framework name beats a local alias).
KNOWN_ROOTS = ("chainer", "chainermn", "mnify")
# Where ChainerMN keeps its iterator factories (mnify re-exports them at the top).
CHAINERMN_ITERATORS_MODULE = "chainermn.iterators"


OPTIMIZERS_MODULE = "chainer.optimizers"


def is_chainer_name(qname: str) -> bool:
    """Defined by Chainer itself (not by the user or another library)."""
    return under(qname, "chainer")


# ------------------------------------------------------------------------- files written
# Calls that write a file (or make a directory) wherever they run: on every rank unless guarded.
FILE_WRITERS = frozenset(
    {
        "numpy.save",
        "numpy.savez",
        "numpy.savez_compressed",
        "numpy.savetxt",
        "pickle.dump",
        "json.dump",
        "yaml.dump",
        "yaml.safe_dump",
        "matplotlib.pyplot.savefig",
        "shutil.copy",
        "shutil.copy2",
        "shutil.copyfile",
        "shutil.copytree",
        "os.makedirs",
        "os.mkdir",
        "cv2.imwrite",
        "imageio.imwrite",
        "imageio.imsave",
        "scipy.misc.imsave",
        "chainer.training.extensions.dump_graph",
    }
)
# Method names many classes define (Chainer's links, optimizers, extensions, file objects, and
# the built-in types' own, ``d.items()``): a call of one on an object of unknown class is never
# taken for the one project class that defines it (program/effects.py), nor a writing method of
# that name guarded at its calls by name (rewrites/helper_writes.py).
COMMON_METHOD_NAMES = frozenset(
    {
        "__call__",
        "__init__",
        "forward",
        "update",
        "setup",
        "extend",
        "run",
        "save",
        "load",
        "serialize",
        "write",
        "read",
        "close",
        "flush",
        "get",
        "append",
        "add",
        "evaluate",
        "report",
        "reset",
        "finalize",
        "initialize",
        "cleargrads",
        "zerograds",
        "add_hook",
        "backward",
        "to_gpu",
        "to_cpu",
        "to_device",
    }
) | frozenset(
    name for kind in (str, bytes, list, dict, set, tuple, int, float, object) for name in dir(kind)
)
# Writers that write through the file object an ``open`` made (that ``open`` is the write).
WRITERS_THROUGH_A_FILE = frozenset({"pickle.dump", "json.dump", "yaml.dump", "yaml.safe_dump"})
# Calls that read a file from the path they are given first (rewrites/shared_files.py).
FILE_READERS = frozenset(
    {
        "numpy.load",
        "numpy.loadtxt",
        "numpy.genfromtxt",
        "chainer.serializers.load_npz",
        "chainer.serializers.npz.load_npz",
        "chainer.serializers.load_hdf5",
        "chainer.serializers.hdf5.load_hdf5",
        "pandas.read_csv",
        "pandas.read_pickle",
        "pandas.read_json",
        "shutil.copy",
        "shutil.copyfile",
        "shutil.copy2",
    }
)
# Methods that write whatever object they are called on (a figure, a data frame, an image).
WRITER_METHODS = frozenset({"savefig", "to_csv"})
# Constructors whose objects' ``save(path)`` writes an image file.
IMAGE_FACTORIES = frozenset({"PIL.Image.fromarray", "PIL.Image.new", "PIL.Image.open"})
# open() modes that write.
WRITE_MODES = ("w", "a", "x", "+")
OPEN_FUNCTIONS = frozenset({"builtins.open", "io.open"})
# Building the graph to dump it (what the dump_graph extension does on rank 0): one walk over
# the last loss's graph, bookkeeping next to a training step.
GRAPH_DUMPERS = frozenset({"chainer.computational_graph.build_computational_graph"})
# Chainer's configuration switches (``with chainer.no_backprop_mode():``): entering one sets a
# flag, the work is whatever runs inside, so the switch itself is bookkeeping.
CONFIG_SWITCHES = frozenset(
    {"chainer.no_backprop_mode", "chainer.force_backprop_mode", "chainer.using_config"}
)
# Reading a clock (time stamps for logs): bookkeeping. ``time.sleep`` is not among them.
CLOCK_FUNCTIONS = frozenset(
    {
        "time.time",
        "time.time_ns",
        "time.perf_counter",
        "time.monotonic",
        "time.process_time",
        "time.strftime",
        "datetime.datetime.now",
    }
)
# Objects that write rows through a file object they are given.
ROW_WRITER_FACTORIES = frozenset({"csv.writer", "csv.DictWriter"})
# Creating a directory on every rank is harmless with exist_ok (lint does not flag it; the
# converter still puts result-directory creation on rank 0 with the rest of the writing).
DIRECTORY_MAKERS = frozenset({"os.makedirs", "os.mkdir"})
# Decorators and base classes that make a user function or class a Trainer extension.
EXTENSION_DECORATORS = frozenset(
    {"chainer.training.make_extension", "chainer.training.extension.make_extension"}
)


def is_file_writer(qname: str) -> bool:
    return qname in FILE_WRITERS or is_serializer_save(qname)


def is_extension_base(qname: str) -> bool:
    """``training.Extension`` or a reporting extension a user class may derive from."""
    return (under(qname, "chainer.training") and last(qname) == "Extension") or (
        is_reporting_extension(qname)
    )


def is_image_factory(qname: str) -> bool:
    return qname in IMAGE_FACTORIES


# ------------------------------------------------------------------------- evaluators
# (issue 12, pattern 5; owned by the evaluator rewrite, mnify/rewrites/evaluator.py)
# Evaluators of other libraries whose metric is computed over the whole test set at once
# (detection mAP, segmentation mIoU, ROC-AUC, R^2): a mean of per-shard values is wrong, so
# the converter gathers them, as it does the user's Evaluator subclasses that override
# ``evaluate`` (package -> class names, any submodule spelling).
WHOLE_SET_EVALUATORS: dict[str, frozenset[str]] = {
    "chainercv.extensions": frozenset(
        {
            "DetectionVOCEvaluator",
            "DetectionCOCOEvaluator",
            "SemanticSegmentationEvaluator",
            "InstanceSegmentationVOCEvaluator",
            "InstanceSegmentationCOCOEvaluator",
        }
    ),
    "chainer_chemistry.training.extensions": frozenset(
        {"BatchEvaluator", "ROCAUCEvaluator", "PRCAUCEvaluator", "R2ScoreEvaluator"}
    ),
}
# The method whose override makes an Evaluator subclass compute its own metric.
EVALUATE_METHOD = "evaluate"
# create_multi_node_evaluator's keyword (mnify only) that gathers instead of averaging.
GATHER_KEYWORD = "gather"


def is_whole_set_evaluator(qname: str) -> bool:
    """A library evaluator whose metric is not a mean over batches (``DetectionVOCEvaluator``)."""
    bare = qname.lstrip(".")
    return any(
        under(bare, package) and last(bare) in names
        for package, names in WHOLE_SET_EVALUATORS.items()
    )


def is_evaluator_class(qname: str) -> bool:
    """Chainer's Evaluator or a library evaluator built on it (a base for user subclasses)."""
    return is_evaluator(qname) or is_whole_set_evaluator(qname)


def is_mnify_runtime_name(qname: str) -> bool:
    """A name of mnify's runtime (which has what ChainerMN lacks, e.g. ``gather=True``)."""
    return under(qname.lstrip("."), "mnify.runtime")


# ------------------------------------------------------------------------- end of evaluators


# ------------------------------------------------------------------------- multi-node runtime
def is_communicator_factory(qname: str) -> bool:
    return qname.lstrip(".") in COMMUNICATOR_FACTORIES


def is_scatter(qname: str) -> bool:
    return qname.lstrip(".") in SCATTER_FUNCTIONS


def is_multi_node_optimizer_factory(qname: str) -> bool:
    return qname.lstrip(".") in MULTI_NODE_OPTIMIZER_FACTORIES


def is_multi_node_evaluator_factory(qname: str) -> bool:
    return qname.lstrip(".") in MULTI_NODE_EVALUATOR_FACTORIES


def is_multi_node_iterator_factory(qname: str) -> bool:
    return is_runtime_name(qname, "create_multi_node_iterator", "create_synchronized_iterator")


def is_mnbn_factory(qname: str) -> bool:
    return is_runtime_name(qname, "create_mnbn_model")


def is_parallel_convolution(qname: str) -> bool:
    return is_runtime_name(qname, "ParallelConvolution2D")


# ------------------------------------------------------------------------- effects
# The fixed effect table of mnify/program/effects.py: what calls into the libraries whose source
# mnify never analyses do (the standard library, Chainer, NumPy, CuPy, MPI, mnify's runtime, and
# a few large libraries whose only effects that matter here are the writers named below).
# Every other package is read from its source on disk, lazily.
EFFECT_TABLE_ROOTS = frozenset(
    {
        "chainer",
        "chainermn",
        "mnify",
        "numpy",
        "cupy",
        "cupyx",
        "mpi4py",
        "matplotlib",
        "PIL",
        "cv2",
        "pandas",
        "scipy",
        "sklearn",
        "yaml",
        "tqdm",
        "six",
        "imageio",
        "h5py",
        "torch",
        "tensorflow",
        "rdkit",
        "networkx",
    }
)
# Calls that write, create or remove files, besides FILE_WRITERS and Chainer's serializers.
EFFECT_FILE_WRITERS = FILE_WRITERS | frozenset(
    {
        "os.remove",
        "os.unlink",
        "os.rename",
        "os.replace",
        "os.renames",
        "os.symlink",
        "os.link",
        "os.rmdir",
        "os.removedirs",
        "os.truncate",
        "shutil.move",
        "shutil.rmtree",
        "shutil.make_archive",
        "shutil.copymode",
        "shutil.copystat",
        "shutil.copyfileobj",
        "numpy.ndarray.tofile",
        "pandas.DataFrame.to_csv",
        "pandas.DataFrame.to_pickle",
        "pandas.to_pickle",
        "matplotlib.pyplot.imsave",
        "PIL.Image.Image.save",
        "urllib.request.urlretrieve",
        "pathlib.Path.write_text",
        "pathlib.Path.write_bytes",
        "pathlib.Path.mkdir",
        "pathlib.Path.touch",
        "pathlib.Path.unlink",
        "pathlib.Path.rename",
        "pathlib.Path.replace",
        "pathlib.Path.rmdir",
        "pathlib.Path.symlink_to",
        "tempfile.mkdtemp",
        "tempfile.mkstemp",
    }
)
# Methods that write whatever object (of a class mnify cannot see) they are called on.
EFFECT_WRITER_METHODS = WRITER_METHODS | frozenset(
    {"write_text", "write_bytes", "to_pickle", "to_hdf", "to_excel", "to_parquet", "tofile"}
)
# Chainer's extensions that write files when the trainer they are added to runs.
EFFECT_WRITING_EXTENSIONS = REPORTING_EXTENSION_NAMES | frozenset(
    {"snapshot", "snapshot_object", "dump_graph", "DumpGraph", "VariableStatisticsPlot"}
)
# Calls that change where or what Python imports (a class defined through one of these is
# unpicklable on a rank that did not make the same change).
EFFECT_IMPORT_CHANGERS = frozenset(
    {
        "sys.path.insert",
        "sys.path.append",
        "sys.path.extend",
        "importlib.import_module",
        "importlib.util.spec_from_file_location",
        "importlib.util.module_from_spec",
        "importlib.machinery.SourceFileLoader",
        "imp.load_source",
        "imp.load_module",
        "runpy.run_path",
        "runpy.run_module",
        "builtins.__import__",
        "builtins.exec",
    }
)
# Receivers named like these run training when their ``update()`` / ``run()`` is called and
# their class cannot be seen (a parameter): ``optimizer.update()``, ``trainer.run()``.
_TRAINING_RECEIVER = re.compile(r"(^|_)(opt\w*|optimizer\w*|\w*updater)$", re.IGNORECASE)
_TRAINER_RECEIVER = re.compile(r"trainer", re.IGNORECASE)


def effect_of_named(qname: str) -> tuple[str, ...]:
    """The effect kinds of calling ``qname`` (a function or class of a table library)."""
    bare = qname.lstrip(".")
    kinds: list[str] = []
    if bare in EFFECT_FILE_WRITERS or is_serializer_save(bare):
        kinds.append("writes")
    if is_extension(bare, *EFFECT_WRITING_EXTENSIONS):
        kinds.append("writes")
    if bare in SUBPROCESS_CALLS:
        kinds += ["writes", "forks"]
    if bare in FORK_CALLS or bare in PROCESS_FACTORIES:
        kinds.append("forks")
    if bare in EFFECT_IMPORT_CHANGERS:
        kinds.append("imports")
    if is_dataset_factory(bare) and last(bare).startswith("get_"):
        kinds.append("reads-data")
    if (
        is_scatter(bare)
        or is_multi_node_optimizer_factory(bare)
        or bare in GLOBAL_BATCH_COLLECTIVES
    ):
        kinds.append("collective")
    return tuple(dict.fromkeys(kinds))


def effect_of_method(cls: str, method: str) -> tuple[str, ...]:
    """The effect kinds of ``obj.method()`` for ``obj`` made by ``cls`` of a table library
    (a class, or a factory such as ``create_multi_node_optimizer``)."""
    bare = cls.lstrip(".")
    kinds = list(effect_of_named(f"{bare}.{method}"))
    name = last(bare)
    if method == "update" and (
        is_optimizer(bare)
        or (under(bare, "chainer") and ("Optimizer" in name or name.endswith("Updater")))
        or is_multi_node_optimizer_factory(bare)
        or under(bare, "chainer.training.updaters")
    ):
        kinds.append("trains")
    if method == "run" and is_trainer(bare):
        kinds.append("trains")
    if method in COLLECTIVE_METHODS and (
        is_communicator_factory(bare)
        or under(bare, "mpi4py")
        or is_multi_node_optimizer_factory(bare)
    ):
        kinds.append("collective")
    if bare in OPEN_FUNCTIONS | {"open"} and method in ("write", "writelines"):
        kinds.append("writes")
    return tuple(dict.fromkeys(kinds))


def effect_of_unknown_method(receiver: str, method: str) -> tuple[str, ...]:
    """The effect kinds of ``receiver.method()`` when the receiver's class is not known:
    writer methods, ``optimizer.update()``, ``trainer.run()``, ``comm.bcast_obj()``."""
    kinds: list[str] = []
    if method in EFFECT_WRITER_METHODS:
        kinds.append("writes")
    if method == "update" and _TRAINING_RECEIVER.search(receiver):
        kinds.append("trains")
    if method == "run" and _TRAINER_RECEIVER.search(receiver):
        kinds.append("trains")
    if method in COLLECTIVE_METHODS and looks_like_communicator(receiver):
        kinds.append("collective")
    return tuple(kinds)
