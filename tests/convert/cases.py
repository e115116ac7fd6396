"""The converter fixtures: where they live, the flags each converts with, how each runs tiny.

Single-file cases are ``fixtures/convert/NAME.in.py -> NAME.out.py``; a multi-file case is a
directory ``fixtures/convert/NAME/in/`` converted together into ``NAME/out/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mnify.rewrites.options import ConvertOptions

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "convert"


@dataclass(frozen=True)
class Case:
    name: str
    options: ConvertOptions = ConvertOptions()
    # command line for a tiny CPU run (original and converted alike)
    run_args: tuple[str, ...] = ()
    entry: str = "train.py"  # multi-file cases: the script to run
    # glob patterns of files rank 0 writes in its working directory (rank 1 writes nothing)
    writes: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def multi(self) -> bool:
        return (FIXTURES / self.name).is_dir()

    @property
    def source(self) -> Path:
        return FIXTURES / self.name / "in" if self.multi else FIXTURES / f"{self.name}.in.py"

    @property
    def expected(self) -> Path:
        return FIXTURES / self.name / "out" if self.multi else FIXTURES / f"{self.name}.out.py"


CASES = [
    Case(
        "mnist_mlp",
        run_args=(
            "--synthetic",
            "32",
            "--batchsize",
            "8",
            "--epoch",
            "2",
            "--unit",
            "16",
            "--noplot",
            "--out",
            "result",
        ),
        writes=("result/log", "result/snapshot_iter_*", "result/cg.dot"),
    ),
    Case(
        "cifar_cnn_bn",
        run_args=(
            "--synthetic",
            "32",
            "--batchsize",
            "8",
            "--epoch",
            "2",
            "--width",
            "4",
            "--early-stopping",
            "validation/main/loss",
            "--out",
            "result",
        ),
        writes=("result/log", "result/snapshot_epoch_2", "result/model_epoch_2"),
    ),
    Case(
        "dcgan",
        run_args=(
            "--synthetic",
            "32",
            "--batchsize",
            "8",
            "--epoch",
            "2",
            "--n_hidden",
            "4",
            "--out",
            "result",
        ),
        writes=("result/log", "result/gen_iter_*.npz", "result/dis_iter_*.npz"),
    ),
    Case(
        "custom_loop",
        run_args=(
            "--synthetic",
            "32",
            "--batchsize",
            "8",
            "--epoch",
            "2",
            "--unit",
            "16",
            "--out",
            ".",
        ),
        writes=("mlp.model", "mlp.state"),
    ),
    Case(
        "multiprocess_iterator",
        run_args=(
            "--synthetic",
            "64",
            "--batchsize",
            "8",
            "--epoch",
            "2",
            "--loaderjob",
            "1",
            "--out",
            "result",
        ),
        writes=("result/log",),
    ),
    Case(
        "old_style",
        run_args=("--synthetic", "64", "--batchsize", "8", "--epoch", "2", "--out", "result"),
        writes=("result/log",),
    ),
    Case(
        "import_aliases",
        run_args=("--synthetic", "32", "--batchsize", "4", "--epoch", "2", "--out", "result"),
        writes=("result/log", "result/model.npz"),
    ),
    Case(
        "model_parallel_cnn",
        options=ConvertOptions(model_parallel="channel"),
        run_args=("--synthetic", "32", "--batchsize", "8", "--epoch", "2", "--out", "result"),
        writes=("result/log",),
    ),
]

BY_NAME = {c.name: c for c in CASES}


def read_sources(case: Case) -> dict[str, str]:
    """``{path: text}`` of the case's input file(s), paths relative to the fixtures dir."""
    if case.multi:
        files = sorted(case.source.glob("*.py"))
    else:
        files = [case.source]
    return {str(f.relative_to(FIXTURES)): f.read_text(encoding="utf-8") for f in files}


def expected_path(case: Case, source_rel: str) -> Path:
    if case.multi:
        return case.expected / Path(source_rel).name
    return case.expected
