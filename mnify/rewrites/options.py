"""What the user asked for (CLI flags) and how generated code spells the runtime's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mnify import vocabulary as vocab

Target = Literal["mnify", "chainermn"]
CommunicatorChoice = Literal["auto", "naive", "flat", "hierarchical", "pure_nccl"]
Scaling = Literal["weak", "strong"]
ModelParallel = Literal["none", "channel", "spatial"]
ScaleLr = Literal["none", "linear"]
DataMode = Literal["scatter", "global"]


@dataclass(frozen=True)
class ConvertOptions:
    """The conversion flags of ``mnify convert`` (docs/design.md §2)."""

    target: Target = "mnify"
    communicator: CommunicatorChoice = "auto"
    scaling: Scaling = "weak"
    model_parallel: ModelParallel = "none"
    # --scale-lr linear: learning rate x comm.size, reached by a linear warm-up (weak scaling)
    scale_lr: ScaleLr = "none"
    warmup_epochs: int = 5
    # --data global: every rank holds the whole training set and reads its part of one global
    # sample schedule (mn.create_global_batch_iterator, docs/global_batch.md); scatter: shards
    data: DataMode = "scatter"
    # --grow-batch: learning-rate decay becomes mn.extensions.GrowBatch (implies --data global
    # and --scaling strong)
    grow_batch: bool = False
    # Files already distributed (ChainerMN, mnify output) are left unchanged; tests switch this
    # off to prove that the rewrites themselves are idempotent.
    leave_distributed: bool = True
    # Only the rewrites fixing these lint rules run (``mnify lint --fix``); None: all of them.
    only_codes: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.grow_batch and (self.data != "global" or self.scaling != "strong"):
            raise ValueError("grow_batch needs data='global' and scaling='strong'")

    @property
    def data_parallel(self) -> bool:
        return self.model_parallel == "none"

    @property
    def global_data(self) -> bool:
        """The training set whole on every rank, read through the global-batch iterator."""
        return self.data == "global" and self.data_parallel


@dataclass(frozen=True)
class Spelling:
    """How emitted code names the runtime: ``mn.X`` for mnify, ``chainermn.X`` for ChainerMN."""

    target: Target

    @property
    def prefix(self) -> str:
        return "mn" if self.target == "mnify" else "chainermn"

    @property
    def import_line(self) -> str:
        return "from mnify import runtime as mn" if self.target == "mnify" else "import chainermn"

    @property
    def module(self) -> str:
        """The qualified module the import binds (what QualifiedNameProvider reports)."""
        return "mnify.runtime" if self.target == "mnify" else "chainermn"

    def top(self, name: str) -> str:
        """A top-level runtime name: create_communicator, scatter_dataset, ..."""
        return f"{self.prefix}.{name}"

    def links(self, name: str) -> str:
        return f"{self.prefix}.links.{name}"

    def iterators(self, name: str) -> str:
        # ChainerMN keeps the iterator factories in chainermn.iterators; mnify re-exports them.
        if self.target == "chainermn":
            return f"{vocab.CHAINERMN_ITERATORS_MODULE}.{name}"
        return f"mn.{name}"
