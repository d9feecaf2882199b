"""Polynomial feature forecasting (TaylorSeer draft), pure tensor code.

A forecast of degree ``m`` through the last ``m + 1`` anchors ``(x_j, F_j)`` is a linear
combination ``sum_j w_j F_j`` whose weights depend on the abscissae only. The weights are
computed on the host in float64 (no device work, no sync); the combination is formed in fp32
from anchors kept in the model dtype, so near-equal bf16 features are not differenced in bf16.

Two forms:
- ``"newton"``: the exact interpolating polynomial through the anchors at any spacing
  (Lagrange weights, identical to Newton's divided differences).
- ``"taylor"``: TaylorSeer's recursion ``D^{i+1}_k = (D^i_k - D^i_{k-1}) / (x_k - x_{k-1})``,
  ``F(x) = sum_i D^i_k (x - x_k)^i / i!``. It divides each level by the latest gap only, so it is
  the exact interpolant only for uniform spacing and ``m <= 1``; kept for reproduction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import kernels


def newton_weights(xs: Sequence[float], x: float) -> list[float]:
    """Weights of the interpolating polynomial through ``xs`` evaluated at ``x``.

    Args:
        xs: distinct anchor abscissae (any order, any spacing).
        x: where to evaluate.

    Returns:
        ``w`` with ``sum_j w[j] * F(xs[j])`` equal to the interpolant at ``x``.

    Example:
        >>> newton_weights([0.0, 1.0], 2.0)
        [-1.0, 2.0]
    """
    if len(set(xs)) != len(xs):
        raise ValueError(f"anchor abscissae must be distinct, got {list(xs)}")
    weights = []
    for j, xj in enumerate(xs):
        w = 1.0
        for k, xk in enumerate(xs):
            if k != j:
                w *= (x - xk) / (xj - xk)
        weights.append(w)
    return weights


def taylor_weights(xs: Sequence[float], x: float) -> list[float]:
    """Weights of TaylorSeer's forecast from anchors ``xs`` (oldest first) at ``x``.

    The derivative levels are tracked as weight vectors over the anchors, following the
    reference recursion exactly, so the result matches the official implementation.

    Example:
        >>> taylor_weights([0.0, 1.0], 3.0)
        [-2.0, 3.0]
    """
    n = len(xs)
    if n == 0:
        raise ValueError("need at least one anchor")
    # levels[j][i]: weight vector of D^i at anchor j (only the levels the recursion has there).
    levels: list[list[list[float]]] = []
    for j in range(n):
        unit = [0.0] * n
        unit[j] = 1.0
        current = [unit]
        if j > 0:
            gap = xs[j] - xs[j - 1]
            if gap == 0:
                raise ValueError(f"anchor abscissae must be distinct, got {list(xs)}")
            for i, prev in enumerate(levels[j - 1]):
                current.append([(a - b) / gap for a, b in zip(current[i], prev)])
        levels.append(current)
    last = levels[-1]
    dx = x - xs[-1]
    weights = [0.0] * n
    for i, d in enumerate(last):
        coef = dx**i / math.factorial(i)
        weights = [w + coef * v for w, v in zip(weights, d)]
    return weights


def extrapolation_weights(xs: Sequence[float], x: float, form: str) -> list[float]:
    """Dispatch to :func:`newton_weights` or :func:`taylor_weights`."""
    if form == "newton":
        return newton_weights(xs, x)
    if form == "taylor":
        return taylor_weights(xs, x)
    raise ValueError(f"form={form!r} is not supported: choose 'newton' or 'taylor'")


def combine(anchors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """``sum_j weights[j] * anchors[j]`` accumulated in fp32 (returns fp32): :func:`diffspec.kernels.forecast`."""
    return kernels.forecast(anchors, weights)


class TaylorForecaster:
    """Keeps the last ``order + 1`` anchors of one batched feature, per batch row, and extrapolates it.

    The first dimension of every value is the batch. Rows normally share their anchors' abscissae
    (one set of host weights, a scalar combination); when rows diverge (per-row decisions of
    ``speca``), ``update(..., rows=...)`` writes only some rows and each row is extrapolated from
    its own anchors.

    Args:
        order: polynomial order (uses fewer anchors until ``order + 1`` exist).
        form: ``"newton"`` or ``"taylor"`` (see module docstring).

    Example:
        >>> f = TaylorForecaster(order=1)
        >>> f.update(0.0, torch.zeros(2)); f.update(1.0, torch.ones(2))
        >>> f.forecast(3.0)
        tensor([3., 3.])
    """

    def __init__(self, order: int = 1, form: str = "newton") -> None:
        if form not in ("newton", "taylor"):
            raise ValueError(f"form={form!r} is not supported: choose 'newton' or 'taylor'")
        self.order = order
        self.form = form
        self.reset()

    def reset(self) -> None:
        """Drop all anchors."""
        self._slots: list[torch.Tensor | None] = [None] * (self.order + 1)
        self._owned: set[int] = set()  # slots holding a buffer of ours (safe to write in place)
        self._hist: list[tuple[tuple[float, int], ...]] = []  # per row: ((x, slot), ...), oldest first

    def update(self, x: float, value: torch.Tensor, rows: Sequence[int] | None = None) -> None:
        """Record ``value`` (batch first) as the anchor at ``x`` for ``rows`` (default: all rows).

        ``value`` holds either every row or just ``rows``, in that order (a sub-batch). It is kept
        in its own dtype; a full-batch update keeps a reference, no copy. An anchor at the same
        ``x`` as a row's latest one replaces it.
        """
        value = value.detach()
        if rows is None or not self._hist:
            if len(self._hist) != value.shape[0]:
                self.reset()
                self._hist = [()] * value.shape[0]
            rows = range(len(self._hist)) if rows is None else rows
        sub_batch = value.shape[0] != len(self._hist)
        if sub_batch and value.shape[0] != len(rows):
            raise ValueError(f"update: {value.shape[0]} value rows for {len(rows)} rows of a batch of {len(self._hist)}")
        by_slot: dict[int, list[tuple[int, int]]] = {}  # slot -> [(row, row in value)]
        for i, r in enumerate(rows):
            hist = self._hist[r]
            if hist and hist[-1][0] == x:
                hist = hist[:-1]
            used = {slot for _, slot in hist}
            slot = next(s for s in range(self.order + 1) if s not in used) if len(hist) <= self.order else hist[0][1]
            hist = hist[1:] if len(hist) > self.order else hist
            self._hist[r] = (*hist, (float(x), slot))
            by_slot.setdefault(slot, []).append((r, i if sub_batch else r))
        for slot, pairs in by_slot.items():
            buf = self._slots[slot]
            if len(pairs) == len(self._hist) and not sub_batch:
                self._slots[slot] = value
                self._owned.discard(slot)
                continue
            if slot not in self._owned:
                if buf is None:
                    buf = torch.zeros((len(self._hist), *value.shape[1:]), dtype=value.dtype, device=value.device)
                else:
                    buf = buf.clone()
                self._slots[slot] = buf
                self._owned.add(slot)
            target = torch.tensor([r for r, _ in pairs]).to(value.device, non_blocking=True)
            source = torch.tensor([i for _, i in pairs]).to(value.device, non_blocking=True)
            buf.index_copy_(0, target, value.index_select(0, source))  # type: ignore[union-attr]

    def forecast(self, x: float) -> torch.Tensor:
        """Extrapolate every row to ``x``; returns fp32. Rows without anchors get zeros."""
        if not any(self._hist):
            raise RuntimeError("forecast() called before any anchor was recorded")
        groups: dict[tuple, list[int]] = {}
        for r, hist in enumerate(self._hist):
            groups.setdefault(hist, []).append(r)
        if len(groups) == 1:  # rows in step: one scalar combination
            hist = self._hist[0]
            weights = extrapolation_weights([h[0] for h in hist], float(x), self.form)
            return combine([self._slots[slot] for _, slot in hist], weights)  # type: ignore[misc]
        table = [[0.0] * len(self._hist) for _ in self._slots]
        for hist, rows in groups.items():
            if not hist:
                continue
            weights = extrapolation_weights([h[0] for h in hist], float(x), self.form)
            for (_, slot), w in zip(hist, weights):
                for r in rows:
                    table[slot][r] = w
        present = [slot for slot, buf in enumerate(self._slots) if buf is not None]
        w_rows = torch.tensor([table[s] for s in present], dtype=torch.float32)
        anchors = [self._slots[s] for s in present]
        return kernels.forecast(anchors, w_rows.to(anchors[0].device, non_blocking=True))  # type: ignore[arg-type]

    def set_order(self, order: int) -> None:
        """Change the order before more anchors than ``order + 1`` exist (a cache budget decided early)."""
        if order == self.order:
            return
        if any(len(h) > order + 1 or any(slot > order for _, slot in h) for h in self._hist):
            raise ValueError(f"set_order({order}): more anchors are already recorded than the order keeps")
        self._slots = (self._slots + [None] * (order + 1))[: order + 1]
        self._owned = {s for s in self._owned if s <= order}
        self.order = order

    @property
    def num_anchors(self) -> int:
        """Anchors of the row with the fewest (0 before any update)."""
        return min((len(h) for h in self._hist), default=0)

    @property
    def nbytes(self) -> int:
        """Bytes held by the anchors."""
        return sum(a.numel() * a.element_size() for a in self._slots if a is not None)
