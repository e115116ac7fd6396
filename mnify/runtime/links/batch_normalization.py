"""MultiNodeBatchNormalization: BatchNormalization whose batch statistics span every rank.

With data parallelism each rank sees a small batch; plain BatchNormalization would normalise
with that small batch's noisy statistics and each rank would drift to its own running averages.
This link normalises with the statistics of all ranks' batches together (see
:mod:`mnify.runtime.functions.batch_normalization`; per-rank batch sizes may differ), keeps the
running averages identical on every rank, and in test mode uses them without communicating.

Its persistent values (``avg_mean``, ``avg_var``, ``N``) have the names plain
``BatchNormalization`` uses, so snapshots load either way.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import chainer
import numpy as np
from chainer import initializers, variable

from mnify.runtime.functions.batch_normalization import multi_node_batch_normalization

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


class MultiNodeBatchNormalization(chainer.Link):  # type: ignore[misc]
    """Batch normalization over the global batch of all ranks of ``comm``.

    ``size`` is the channel count (or channel shape); channels sit on axis 1 of the input and
    every axis but those is reduced. ``size=None`` takes the channel count from the first input.
    ``axis`` is accepted for compatibility with ``L.BatchNormalization`` only when it names that
    same layout. ``communication_backend`` is accepted for ChainerMN compatibility; the
    communicator decides how the statistics travel.
    """

    gamma: variable.Parameter | None = None
    beta: variable.Parameter | None = None

    def __init__(
        self,
        size: int | tuple[int, ...] | None,
        comm: CommunicatorBase,
        decay: float = 0.9,
        eps: float = 2e-5,
        dtype: Any = None,
        use_gamma: bool = True,
        use_beta: bool = True,
        initial_gamma: Any = None,
        initial_beta: Any = None,
        communication_backend: str = "auto",
        axis: int | tuple[int, ...] | None = None,
        initial_avg_mean: Any = None,
        initial_avg_var: Any = None,
    ) -> None:
        super().__init__()
        if communication_backend not in ("auto", "mpi", "nccl"):
            raise ValueError(
                f"communication_backend must be 'auto', 'mpi' or 'nccl', not {communication_backend!r}"
            )
        self.comm = comm
        self.decay = decay
        self.eps = eps
        self.axis = (axis,) if isinstance(axis, int) else axis
        self._highprec_dtype = chainer.get_dtype(dtype, map_mixed16=np.float32)
        self._initial_avg_mean = initial_avg_mean
        self._initial_avg_var = initial_avg_var
        self.N = 0
        self.register_persistent("N")
        with self.init_scope():
            if use_gamma:
                self.gamma = variable.Parameter(self._param_initializer(initial_gamma, 1))
            if use_beta:
                self.beta = variable.Parameter(self._param_initializer(initial_beta, 0))
        self.avg_mean: Any = None
        self.avg_var: Any = None
        if size is not None:
            self._initialize_params((size,) if isinstance(size, int) else tuple(size))
        self.register_persistent("avg_mean")
        self.register_persistent("avg_var")

    def _param_initializer(self, initial: Any, default: Any) -> Any:
        initializer = initializers._get_initializer(default if initial is None else initial)
        initializer.dtype = self._highprec_dtype
        return initializer

    def _initialize_params(self, shape: tuple[int, ...]) -> None:
        def generate(init: Any, default: Any) -> Any:
            initializer = initializers._get_initializer(default if init is None else init)
            return initializers.generate_array(
                initializer, shape, self.xp, dtype=self._highprec_dtype, device=self.device
            )

        self.avg_mean = generate(self._initial_avg_mean, 0)
        self.avg_var = generate(self._initial_avg_var, 1)
        self._initial_avg_mean = self._initial_avg_var = None
        if self.gamma is not None:
            self.gamma.initialize(shape)
        if self.beta is not None:
            self.beta.initialize(shape)

    def _check_axis(self, ndim: int, channel_ndim: int) -> None:
        if self.axis is None:
            return
        expected = (0, *range(1 + channel_ndim, ndim))
        if tuple(sorted(a % ndim for a in self.axis)) != expected:
            raise NotImplementedError(
                f"MultiNodeBatchNormalization reduces axes {expected} (channels on axis 1); "
                f"axis={self.axis} is not supported"
            )

    def _ones_or_zeros(self, value: float) -> Any:
        with chainer.using_device(self.device):
            return self.xp.full(self.avg_mean.shape, value, dtype=self._highprec_dtype)

    def forward(self, x: Any, finetune: bool = False) -> chainer.Variable:
        """Normalise ``x`` (N, C, ...) with all ranks' batch statistics (train) or running ones (test)."""
        if self.avg_mean is None:
            self._initialize_params(tuple(x.shape[1:2]))
        self._check_axis(x.ndim, self.avg_mean.ndim)
        gamma = self.gamma if self.gamma is not None else self._ones_or_zeros(1.0)
        beta = self.beta if self.beta is not None else self._ones_or_zeros(0.0)
        if not chainer.config.train:
            return chainer.functions.fixed_batch_normalization(
                x, gamma, beta, self.avg_mean, self.avg_var, self.eps
            )
        if finetune:
            self.N += 1
            decay = 1.0 - 1.0 / self.N
        else:
            decay = self.decay
        running_mean, running_var = self.avg_mean, self.avg_var
        if chainer.config.in_recomputing:  # an extra forward must not count twice
            if finetune:
                self.N -= 1
            running_mean = running_var = None
        return multi_node_batch_normalization(
            x, gamma, beta, self.comm, self.eps, running_mean, running_var, decay
        )

    def start_finetuning(self) -> None:
        """Restart the population count of fine-tuning mode (``forward(x, finetune=True)``)."""
        self.N = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> MultiNodeBatchNormalization:
        # Communicators hold MPI handles that cannot be copied: the copy shares this one's.
        comm = self.comm
        self.comm = None  # type: ignore[assignment]
        try:
            clone = copy.copy(self)
            clone.__dict__ = copy.deepcopy(self.__dict__, memo)
        finally:
            self.comm = comm
        clone.comm = comm
        return clone
