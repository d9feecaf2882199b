"""Gaussian reflection maximal coupling: verify a drafted Gaussian step against the target's.

A draft sample ``y = a + s z`` from ``N(a, s^2 I)`` is checked against the target ``N(b, s^2 I)``
(same ``s``). With ``D = (b - a) / s`` and ``delta = ||D||`` over the whole sample:

1. ``log r = <z, D> - delta^2 / 2`` (``= log q(y) / p(y)``);
2. accept (output ``y`` itself) when ``log u <= min(0, log r)``;
3. otherwise reflect the noise across the hyperplane orthogonal to ``e = D / delta``:
   ``z' = z - 2 <e, z> e`` and output ``b + s z'``.

The output is distributed exactly as ``N(b, s^2 I)`` and the acceptance probability,
``2 Phi(-delta / 2)``, is the largest any coupling achieves (Bou-Rabee, Eberle, Zimmer). Rows
(the first dimension) are independent proposals; the reductions are in float64 over every other
dimension (never a per-element mean), the arithmetic in float32. The implementation is
:func:`diffspec.kernels.reflection_coupling` (torch reference, fused Triton kernel on CUDA); this
module holds its math and the helpers exact samplers build on it.

Example:
    >>> from diffspec.kernels import reflection_coupling
    >>> a, b = torch.zeros(1, 8), torch.full((1, 8), 0.1)
    >>> z = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    >>> out = reflection_coupling(a + z, z, a, b, torch.ones(1), torch.rand(1))
    >>> out.sample.shape, out.accepted.dtype
    (torch.Size([1, 8]), torch.bool)
"""

from __future__ import annotations

import math

import torch


def acceptance_probability(delta: torch.Tensor | float) -> torch.Tensor:
    """``2 Phi(-delta / 2)``: the reflection coupling's acceptance probability at mean distance ``delta``.

    Example:
        >>> round(float(acceptance_probability(0.0)), 6)
        1.0
    """
    delta = torch.as_tensor(delta, dtype=torch.float64)
    return torch.erfc(delta / (2 * math.sqrt(2)))


def first_rejections(accepted: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Steps committed per trajectory: the accepted prefix plus the corrected step at the first rejection.

    Args:
        accepted: ``(B, L)`` per drafted step.
        lengths: ``(B,)`` valid drafted steps per trajectory (later columns are ignored).

    Returns:
        ``(B,)`` long: ``j + 1`` for a first rejection at column ``j``, else ``lengths``.

    Example:
        >>> first_rejections(torch.tensor([[True, False, True], [True, True, True]]), torch.tensor([3, 2]))
        tensor([2, 2])
    """
    steps = torch.arange(accepted.shape[1], device=accepted.device)
    rejected = ~accepted & (steps < lengths.view(-1, 1))
    first = torch.where(rejected, steps, accepted.shape[1]).min(dim=1).values
    return torch.minimum(first + 1, lengths)
