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
from collections import deque
from collections.abc import Sequence

import torch


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
    """``sum_j weights[j] * anchors[j]`` accumulated in fp32 (returns fp32)."""
    out = anchors[0].to(torch.float32) * weights[0]
    for a, w in zip(anchors[1:], weights[1:]):
        out.add_(a, alpha=w)
    return out


class TaylorForecaster:
    """Keeps the last ``order + 1`` anchors of one feature and extrapolates it.

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
        self._xs: deque[float] = deque(maxlen=order + 1)
        self._anchors: deque[torch.Tensor] = deque(maxlen=order + 1)

    def update(self, x: float, value: torch.Tensor) -> None:
        """Append an anchor (kept in its own dtype; no copy is made)."""
        if self._xs and x == self._xs[-1]:
            self._xs.pop()
            self._anchors.pop()
        self._xs.append(float(x))
        self._anchors.append(value.detach())

    def forecast(self, x: float) -> torch.Tensor:
        """Extrapolate to ``x``; returns fp32."""
        if not self._anchors:
            raise RuntimeError("forecast() called before any anchor was recorded")
        weights = extrapolation_weights(list(self._xs), float(x), self.form)
        return combine(list(self._anchors), weights)

    def reset(self) -> None:
        """Drop all anchors."""
        self._xs.clear()
        self._anchors.clear()

    @property
    def num_anchors(self) -> int:
        return len(self._anchors)

    @property
    def nbytes(self) -> int:
        """Bytes held by the anchors."""
        return sum(a.numel() * a.element_size() for a in self._anchors)
