"""Feature forecast ``sum_j w_j * anchor_j`` (+ the verifier's per-row L1 sums) and the anchor ring.

The extrapolation weights come from the host (``diffspec.forecast.taylor``: Newton or Taylor
weights of the anchors' abscissae); this module only forms the combination, in one pass: one read
of each anchor, one write of the forecast, fp32 accumulation whatever the anchors' dtype. With
``true=`` the same pass also returns the per-row sums ``||y_hat - true||_1`` and ``||true||_1``
(rows = the first dimension), the SpecA verifier's ``rel_l1`` numerator and denominator.

:class:`AnchorRing` keeps the last ``slots`` anchors in one preallocated ``[slots, ...]`` tensor;
appending writes the new anchor into the slot that falls out and rotates a slot-order list (the
other slots are never copied), so :func:`forecast` can read the ring in place.

Example:
    >>> ring = AnchorRing(slots=2)
    >>> ring.append(torch.zeros(2, 3)); ring.append(torch.ones(2, 3))
    >>> forecast(ring.buffer, [-1.0, 2.0], order=ring.order)[0].tolist()
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .dispatch import use_triton

Weights = Sequence[float] | torch.Tensor
"""One weight per anchor shared by every row, or a ``[n_anchors, rows]`` fp32 tensor (per-row weights)."""


def _anchor_list(anchors: torch.Tensor | Sequence[torch.Tensor], order: Sequence[int] | None) -> list[torch.Tensor]:
    if isinstance(anchors, torch.Tensor):
        if order is None:
            raise ValueError("forecast: a ring tensor [slots, ...] needs order= (its slot ids, oldest first)")
        return [anchors[s] for s in order]
    if order is not None:
        return [anchors[s] for s in order]
    return list(anchors)


def _check(anchors: list[torch.Tensor], weights: Weights, true: torch.Tensor | None) -> None:
    if not anchors:
        raise ValueError("forecast: need at least one anchor")
    shape = anchors[0].shape
    if any(a.shape != shape for a in anchors):
        raise ValueError(f"forecast: anchors must share one shape, got {[tuple(a.shape) for a in anchors]}")
    n = len(anchors)
    if isinstance(weights, torch.Tensor):
        if weights.shape != (n, shape[0]):
            raise ValueError(f"forecast: per-row weights must be [{n}, {shape[0]}] (anchors, rows), "
                             f"got {tuple(weights.shape)}")
    elif len(weights) != n:
        raise ValueError(f"forecast: {len(weights)} weights for {n} anchors")
    if true is not None and true.shape != shape:
        raise ValueError(f"forecast: true {tuple(true.shape)} must have the anchors' shape {tuple(shape)}")


def l1_sums_reference(draft: torch.Tensor, true: torch.Tensor, base: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`l1_error`: ``(sum |draft - true|, sum |true - base|)`` per row, fp32."""
    d, y = draft.float() - true.float(), true.float()
    if base is not None:
        y = y - base.float()
    dims = tuple(range(1, d.dim()))
    return d.abs().sum(dims), y.abs().sum(dims)


def forecast_reference(anchors: Sequence[torch.Tensor], weights: Weights, true: torch.Tensor | None = None,
                       out_dtype: torch.dtype = torch.float32):
    """Torch reference of :func:`forecast` (the arithmetic ``TaylorForecaster`` always used)."""
    if isinstance(weights, torch.Tensor):  # per-row weights: fp32 multiply-adds row-broadcast
        shape = (anchors[0].shape[0],) + (1,) * (anchors[0].dim() - 1)
        out = torch.zeros(anchors[0].shape, dtype=torch.float32, device=anchors[0].device)
        w = weights.to(device=out.device, dtype=torch.float32)
        for a, w_j in zip(anchors, w):
            out.addcmul_(a.float(), w_j.view(shape))
    else:
        out = anchors[0].to(torch.float32) * weights[0]
        for a, w_j in zip(anchors[1:], weights[1:]):
            out.add_(a, alpha=w_j)
    result = out if out_dtype == torch.float32 else out.to(out_dtype)
    if true is None:
        return result
    return (result, *l1_sums_reference(out, true))


def forecast(anchors: torch.Tensor | Sequence[torch.Tensor], weights: Weights, *, order: Sequence[int] | None = None,
             true: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32, backend: str | None = None):
    """``sum_j weights[j] * anchors[j]`` in fp32 accumulation, optionally with the verifier's L1 sums.

    Args:
        anchors: the anchors (each ``[rows, ...]``, any float dtype), or a ring tensor
            ``[slots, rows, ...]`` read at the slots ``order``.
        weights: one float per anchor, or a ``[n_anchors, rows]`` tensor of per-row weights.
        order: slot ids, oldest first (needed for a ring tensor; with a list, picks from it).
        true: ``[rows, ...]`` the true value: also return its per-row L1 distance and norm.
        out_dtype: dtype of the written forecast (the sums use the fp32 accumulator).
        backend: ``None`` (auto), ``"torch"`` or ``"triton"`` (see :mod:`~diffspec.kernels.dispatch`).

    Returns:
        The forecast, or ``(forecast, ||forecast - true||_1, ||true||_1)`` with ``true`` (sums fp32 ``[rows]``).

    Example:
        >>> forecast([torch.zeros(1, 2), torch.ones(1, 2)], [-1.0, 2.0]).tolist()
        [[2.0, 2.0]]
    """
    items = _anchor_list(anchors, order)
    _check(items, weights, true)
    w_tensor = weights if isinstance(weights, torch.Tensor) else None
    if not use_triton([*items, true, w_tensor], backend) or items[0].dim() < 2:
        return forecast_reference(items, weights, true, out_dtype)
    from ._anchors_triton import forecast_triton

    return forecast_triton(items, weights, true, out_dtype)


def l1_error(draft: torch.Tensor, true: torch.Tensor, base: torch.Tensor | None = None, *,
             backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(||draft - true||_1, ||true - base||_1)`` in fp32 (``base`` omitted: ``||true||_1``).

    The verifier's ``rel_l1`` (``rel_res`` with ``base`` = the block input) numerator and
    denominator in one read of each tensor; rows are the first dimension.

    Example:
        >>> num, den = l1_error(torch.ones(2, 3), torch.zeros(2, 3))
        >>> num.tolist(), den.tolist()
        ([3.0, 3.0], [0.0, 0.0])
    """
    if draft.shape != true.shape or (base is not None and base.shape != true.shape):
        raise ValueError(f"l1_error: draft {tuple(draft.shape)}, true {tuple(true.shape)} and base "
                         f"{None if base is None else tuple(base.shape)} must have one shape")
    if not use_triton([draft, true, base], backend) or draft.dim() < 2:
        return l1_sums_reference(draft, true, base)
    from ._anchors_triton import l1_error_triton

    return l1_error_triton(draft, true, base)


class AnchorRing:
    """The last ``slots`` anchors of one tensor in a preallocated ``[slots, ...]`` buffer.

    :meth:`append` writes into the oldest slot once all are used (one copy of the new anchor, none
    of the others) and keeps :attr:`order`, the slot ids oldest first, for :func:`forecast`.

    Args:
        slots: anchors kept (``order + 1`` of the polynomial).

    Example:
        >>> ring = AnchorRing(slots=2)
        >>> for v in range(3):
        ...     ring.append(torch.full((1,), float(v)))
        >>> ring.order, ring.buffer[ring.order[-1]].item()
        ([1, 0], 2.0)
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots={slots} is out of range: allowed [1, inf]")
        self.slots = slots
        self.buffer: torch.Tensor | None = None
        self.order: list[int] = []

    def append(self, value: torch.Tensor) -> None:
        """Record ``value`` as the newest anchor (written into the slot that falls out)."""
        value = value.detach()
        if self.buffer is None or self.buffer.shape[1:] != value.shape or self.buffer.dtype != value.dtype \
                or self.buffer.device != value.device:
            self.buffer = torch.empty((self.slots, *value.shape), dtype=value.dtype, device=value.device)
            self.order = []
        slot = len(self.order) if len(self.order) < self.slots else self.order[0]
        self.buffer[slot].copy_(value)
        self.order = [*self.order[len(self.order) >= self.slots:], slot]

    def anchors(self) -> list[torch.Tensor]:
        """Views of the recorded anchors, oldest first (no copies)."""
        return [] if self.buffer is None else [self.buffer[s] for s in self.order]

    def reset(self) -> None:
        """Forget the anchors (the buffer is kept for reuse)."""
        self.order = []
