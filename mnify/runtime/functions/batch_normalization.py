"""Batch normalization over the ranks' batches together: the function behind MultiNodeBatchNormalization.

Forward: each rank computes per-channel ``[count, sum, sum of squares]`` of its batch (the
squares taken around its own batch mean, so float32 does not cancel), one allreduce adds them
up, and every rank normalises with the mean and (biased) variance of all ranks' examples
together. Because the statistics are sums weighted by counts, ranks may hold
batches of different sizes (even empty ones): the result is exactly plain batch normalization
of the concatenated batch. Running statistics are updated from the same global numbers on every
rank, the variance with the unbiased ``N / (N - 1)`` correction over the global count ``N``.

Backward: the gradient of ``x`` depends on ``sum(gy)`` and ``sum(gy * x_hat)`` over all examples,
so these two per-channel vectors are summed over the ranks in one more allreduce. The gradients
of ``gamma`` and ``beta`` are this rank's own sums: the multi-node optimizer averages them over the
ranks like every other parameter gradient. With the optimizer's mean of per-rank gradients this
reproduces one process training on the concatenated batch with the loss
``mean over ranks of (mean over the rank's batch)``.

The returned gradients are not themselves differentiable (no double backprop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import chainer
import numpy as np
from chainer import backend

from mnify.runtime import kernels

if TYPE_CHECKING:
    from mnify.runtime.communicators.base import CommunicatorBase


def _per_channel(x: Any, channel_shape: tuple[int, ...]) -> Any:
    """View ``x`` shaped (N, *channel_shape, *rest) as (N, C, S), the layout the kernels take."""
    rest = int(np.prod(x.shape[1 + len(channel_shape) :], dtype=np.int64))
    return x.reshape(x.shape[0], int(np.prod(channel_shape, dtype=np.int64)), rest)


def _column(v: Any) -> Any:
    return v.reshape(1, -1, 1)


class MultiNodeBatchNormalizationFunction(chainer.function_node.FunctionNode):  # type: ignore[misc]
    """``y = gamma * (x - mean) / sqrt(var + eps) + beta`` with statistics over every rank.

    ``running_mean`` / ``running_var`` (optional) are updated in place with ``decay``.
    """

    def __init__(
        self,
        comm: CommunicatorBase,
        eps: float = 2e-5,
        running_mean: Any = None,
        running_var: Any = None,
        decay: float = 0.9,
    ) -> None:
        self.comm = comm
        self.eps = eps
        self.running_mean = running_mean
        self.running_var = running_var
        self.decay = decay

    def forward(self, inputs: tuple[Any, ...]) -> tuple[Any]:
        x, gamma, beta = inputs
        xp = backend.get_array_module(x)
        n_channels = gamma.size
        if x.ndim < 2 or x.shape[1 : 1 + gamma.ndim] != gamma.shape:
            raise ValueError(f"x of shape {x.shape} does not have channels {gamma.shape} on axis 1")
        x3 = _per_channel(x, gamma.shape)
        compute_dtype = gamma.dtype
        n_local = x3.shape[0] * x3.shape[2]

        # Two local passes, then one allreduce. Centering on the local mean first keeps the
        # sum of squares free of cancellation (E[x^2] - mean^2 in float32 loses everything once
        # |mean| is ~100x the spread); the ranks' pieces are then combined in float64.
        local_sum, _ = kernels.channel_sums(x3)
        local_mean = (local_sum / max(n_local, 1)).astype(compute_dtype)
        centered = xp.subtract(x3, _column(local_mean), dtype=compute_dtype)  # becomes x_hat
        centered_sum, centered_sumsq = kernels.channel_sums(centered)
        m = local_mean.astype(np.float64)
        stats = xp.empty(1 + 2 * n_channels, dtype=np.float64)
        stats[0] = n_local
        stats[1 : 1 + n_channels] = n_local * m + centered_sum  # sum of x
        stats[1 + n_channels :] = centered_sumsq + 2 * m * centered_sum + n_local * m * m  # of x^2
        stats = self.comm.allreduce(stats, op="sum")
        count = float(stats[0])
        if count == 0:
            raise ValueError("multi-node batch normalization over an empty global batch")
        mean = stats[1 : 1 + n_channels] / count
        var = xp.maximum(stats[1 + n_channels :] / count - mean * mean, 0.0)

        inv_std = (1.0 / xp.sqrt(var + self.eps)).astype(compute_dtype)
        x_hat = centered  # (x - local mean) + (local mean - global mean), scaled, in place
        x_hat += _column((m - mean).astype(compute_dtype))
        x_hat *= _column(inv_std)
        y = _column(gamma.reshape(-1)) * x_hat + _column(beta.reshape(-1))

        self.count = count
        self.inv_std = inv_std
        self.x_hat = x_hat
        self.gamma = gamma
        self.x_shape = x.shape
        self.x_dtype = x.dtype
        if self.running_mean is not None:
            self._update_running(mean, var, count)
        return (y.reshape(x.shape).astype(x.dtype, copy=False),)

    def _update_running(self, mean: Any, var: Any, count: float) -> None:
        unbiased = var * (count / max(count - 1.0, 1.0))
        shape = self.running_mean.shape
        self.running_mean *= self.decay
        self.running_mean += (
            ((1.0 - self.decay) * mean).reshape(shape).astype(self.running_mean.dtype)
        )
        self.running_var *= self.decay
        self.running_var += (
            ((1.0 - self.decay) * unbiased).reshape(shape).astype(self.running_var.dtype)
        )

    def backward(
        self, indexes: tuple[int, ...], grad_outputs: tuple[chainer.Variable, ...]
    ) -> tuple[chainer.Variable, chainer.Variable, chainer.Variable]:
        gy = grad_outputs[0].array
        xp = backend.get_array_module(gy)
        n_channels = self.gamma.size
        gy3 = _per_channel(gy, self.gamma.shape).astype(self.x_hat.dtype, copy=False)
        sum_gy, sum_gy_xhat = kernels.bn_backward_sums(gy3, self.x_hat)
        sums = xp.empty(2 * n_channels, dtype=np.float64)
        sums[:n_channels] = sum_gy
        sums[n_channels:] = sum_gy_xhat
        sums = self.comm.allreduce(sums, op="sum")
        compute_dtype = self.x_hat.dtype
        mean_gy = (sums[:n_channels] / self.count).astype(compute_dtype)
        mean_gy_xhat = (sums[n_channels:] / self.count).astype(compute_dtype)
        scale = _column(self.gamma.reshape(-1).astype(compute_dtype) * self.inv_std)
        gx = scale * (gy3 - _column(mean_gy) - self.x_hat * _column(mean_gy_xhat))
        ggamma = sum_gy_xhat.reshape(self.gamma.shape).astype(self.gamma.dtype)
        gbeta = sum_gy.reshape(self.gamma.shape).astype(self.gamma.dtype)
        return (
            chainer.Variable(gx.reshape(self.x_shape).astype(self.x_dtype, copy=False)),
            chainer.Variable(ggamma),
            chainer.Variable(gbeta),
        )


def multi_node_batch_normalization(
    x: Any,
    gamma: Any,
    beta: Any,
    comm: CommunicatorBase,
    eps: float = 2e-5,
    running_mean: Any = None,
    running_var: Any = None,
    decay: float = 0.9,
) -> chainer.Variable:
    """Batch normalization of ``x`` with the statistics of every rank's batch together.

    ``x`` is shaped ``(N, *gamma.shape, *rest)``; the per-rank ``N`` may differ. Every rank must
    call it (it communicates in forward and backward). ``running_mean``/``running_var``, when
    given, are updated in place, identically on every rank.
    """
    func = MultiNodeBatchNormalizationFunction(comm, eps, running_mean, running_var, decay)
    return func.apply((x, gamma, beta))[0]
