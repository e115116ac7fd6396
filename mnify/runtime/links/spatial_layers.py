"""Convolution and batch normalization that run on slabs of rows (spatial parallelism).

:func:`~mnify.runtime.links.create_spatial_parallel_model` turns a model's plain
``L.Convolution2D`` and ``L.BatchNormalization`` links into these subclasses in place (same
parameters, same names, same snapshots). Called on a tensor that is not a slab they are the
plain links.

* :class:`SpatialConvolution2D`: output rows are split evenly over the group; each rank gathers
  the input rows its outputs read (kernel size, stride, padding and dilation decide which: the
  halo), pads only at the true image borders and convolves with Chainer. The weight and bias
  gradients are summed over the group in backward.
* :class:`SpatialBatchNormalization`: training statistics over the whole image (per-channel
  counts and sums all-reduced, exact for uneven slabs), running averages updated from them;
  at test time the running statistics are used row by row.
"""

from __future__ import annotations

from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L

from mnify.runtime.functions.batch_normalization import multi_node_batch_normalization
from mnify.runtime.functions.halo_exchange import HaloPlan, SlabLayout, halo_gather, rows_needed
from mnify.runtime.functions.halo_overlap import halo_edges, interior
from mnify.runtime.functions.slab_functions import mark_slab, sum_grad_over_group
from mnify.runtime.functions.spatial_pooling import (
    first_rows,
    full_input_of,
    keep_rows,
    pair,
    window_plan,
)
from mnify.runtime.links.spatial_group import SpatialGroup, active_group


def _group_and_layout(link: Any, x: Any) -> tuple[SpatialGroup | None, Any]:
    group = active_group()
    owner: SpatialGroup | None = getattr(link, "spatial_group", None)
    if group is None or owner is not group:
        return None, None
    return owner, owner.layout_of(x)


class SpatialConvolution2D(L.Convolution2D):  # type: ignore[misc]
    """``L.Convolution2D`` that convolves this rank's slab (plus its halo) inside a spatial
    model; see the module doc."""

    spatial_group: SpatialGroup

    def forward(self, x: Any) -> chainer.Variable:
        group, layout = _group_and_layout(self, x)
        if layout is None:
            result: chainer.Variable = super().forward(x)
            return result
        assert group is not None
        if self.W.array is None:
            self._initialize_params(x.shape[1])
        a = layout.axis - 2
        k, s, p, d = pair(self.ksize), pair(self.stride), pair(self.pad), pair(self.dilate)
        out_layout, plan = window_plan(group, layout, k[a], s[a], p[a], d[a])
        full = full_input_of(x)
        local_pad = (0, p[1]) if a == 0 else (p[0], 0)
        W = sum_grad_over_group(group.comm, self.W)
        b = sum_grad_over_group(group.comm, self.b)

        def conv(rows: Any) -> chainer.Variable:
            out: chainer.Variable = F.convolution_2d(
                rows, W, b, s, local_pad, dilate=d, groups=self.groups
            )
            return out

        window = (k[a], s[a], p[a], d[a])
        if group.overlap and full is None and _interior_everywhere(plan, out_layout, window):
            y = self._overlapped(group, x, plan, out_layout.bounds[group.rank], window, conv)
        else:
            y = keep_rows(conv(halo_gather(group.comm, x, plan, 0.0, full)), out_layout, group.rank)
        return mark_slab(y, out_layout)

    @staticmethod
    def _overlapped(
        group: SpatialGroup,
        x: Any,
        plan: HaloPlan,
        out_rows: tuple[int, int],
        window: tuple[int, int, int, int],
        conv: Any,
    ) -> chainer.Variable:
        """Post the halo exchange, convolve the interior rows, then the two edges.

        Every rank builds the same graph (both edges, even an empty one: one window, cut to no
        rows), so every rank's backward visits the layers, and so their exchanges and
        all-reduces, in the same order."""
        axis, rank = plan.layout.axis, group.rank
        middle = interior(out_rows, plan.layout.bounds[rank], plan.layout.full, *window)
        spans = (
            rows_needed(out_rows[0], middle[0], *window),
            rows_needed(middle[1], out_rows[1], *window),
        )
        local = tuple(
            rows_needed(*middle, *window) if q == rank else (0, 0) for q in range(group.size)
        )
        local_plan = HaloPlan(plan.layout, local, rank)
        inner, (top, bottom) = halo_edges(
            group.comm, x, plan, spans, lambda: conv(halo_gather(group.comm, x, local_plan))
        )
        parts = [
            first_rows(conv(top), middle[0] - out_rows[0], axis),
            inner,
            first_rows(conv(bottom), out_rows[1] - middle[1], axis),
        ]
        joined: chainer.Variable = F.concat(parts, axis=axis)
        return joined


def _interior_everywhere(
    plan: HaloPlan, out_layout: SlabLayout, window: tuple[int, int, int, int]
) -> bool:
    """Whether overlapping pays and is possible on every rank: some rank waits for a halo,
    and every rank has output rows that read none (decided alike on every rank)."""
    layout = plan.layout
    waits = any(HaloPlan(layout, plan.need, q).recvs() for q in range(len(layout.bounds)))
    return waits and all(
        b > a
        for a, b in (
            interior(out_layout.bounds[q], layout.bounds[q], layout.full, *window)
            for q in range(len(layout.bounds))
        )
    )


class SpatialBatchNormalization(L.BatchNormalization):  # type: ignore[misc]
    """``L.BatchNormalization`` whose training statistics cover the whole image (every slab);
    see the module doc."""

    spatial_group: SpatialGroup

    def forward(self, x: Any, **kwargs: Any) -> chainer.Variable:
        group, layout = _group_and_layout(self, x)
        if layout is None:
            plain: chainer.Variable = super().forward(x, **kwargs)
            return plain
        assert group is not None
        if kwargs.get("finetune", False):
            raise NotImplementedError("BatchNormalization(finetune=True) in a spatial model")
        if not chainer.config.train:
            return mark_slab(super().forward(x), layout)
        if self.avg_mean is None:
            self._initialize_params(
                tuple(d for i, d in enumerate(x.shape) if i not in (self.axis or (0, 2, 3)))
            )
        if self.axis not in (None, (0, 2, 3)):
            raise NotImplementedError(
                f"BatchNormalization over axes {self.axis} in a spatial model (only (0, 2, 3))"
            )
        gamma = self.gamma if self.gamma is not None else self._get_gamma()[0]
        beta = self.beta if self.beta is not None else self._get_beta()[0]
        running = not chainer.config.in_recomputing
        y = multi_node_batch_normalization(
            x,
            sum_grad_over_group(group.comm, gamma),
            sum_grad_over_group(group.comm, beta),
            group.batch_norm_comm,
            eps=self.eps,
            running_mean=self.avg_mean if running else None,
            running_var=self.avg_var if running else None,
            decay=self.decay,
        )
        return mark_slab(y, layout)


__all__ = ["SpatialBatchNormalization", "SpatialConvolution2D"]
