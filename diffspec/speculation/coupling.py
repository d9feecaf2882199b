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
dimension (never a per-element mean), the arithmetic in float32.

Example:
    >>> a, b = torch.zeros(1, 8), torch.full((1, 8), 0.1)
    >>> z = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    >>> out = reflection_coupling(a + z, z, a, b, torch.ones(1), torch.rand(1))
    >>> out.sample.shape, out.accepted.dtype
    (torch.Size([1, 8]), torch.bool)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DELTA_EPS = 1e-8
"""Below this mean distance the two laws are treated as equal (always accept)."""


@dataclass(frozen=True)
class CouplingResult:
    """Per-row outcome of :func:`reflection_coupling`.

    Attributes:
        accepted: ``(R,)`` bool, the draft sample was kept.
        sample: ``(R, ...)`` the coupled sample: the draft where accepted, its reflection otherwise.
        log_ratio: ``(R,)`` float64 ``log q(y) / p(y)``.
        delta: ``(R,)`` float64 ``||b - a|| / s``.
    """

    accepted: torch.Tensor
    sample: torch.Tensor
    log_ratio: torch.Tensor
    delta: torch.Tensor


def _row_dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.double() * y.double()).flatten(1).sum(1)


def reflection_coupling(draft: torch.Tensor, noise: torch.Tensor, draft_mean: torch.Tensor,
                        target_mean: torch.Tensor, std: torch.Tensor, uniform: torch.Tensor) -> CouplingResult:
    """Couple each drafted Gaussian step with the target's (see the module docstring).

    Args:
        draft: ``(R, ...)`` the drafted samples ``draft_mean + std * noise`` (returned as they are
            where accepted, so an accepted step is bit-identical to its draft).
        noise: ``(R, ...)`` the standard normal noise the draft used.
        draft_mean: ``(R, ...)`` the draft's mean ``a``.
        target_mean: ``(R, ...)`` the target's mean ``b``.
        std: ``(R,)`` the shared standard deviation ``s > 0`` of each row (not checked here, to keep
            the hot loop free of host reads: a deterministic step cannot be coupled).
        uniform: ``(R,)`` independent ``U(0, 1)`` draws.

    Returns:
        A :class:`CouplingResult`.

    Raises:
        ValueError: mismatched shapes.
    """
    if not (draft.shape == noise.shape == draft_mean.shape == target_mean.shape):
        raise ValueError(f"reflection_coupling: draft {tuple(draft.shape)}, noise {tuple(noise.shape)}, draft_mean "
                         f"{tuple(draft_mean.shape)} and target_mean {tuple(target_mean.shape)} must have one shape")
    rows = draft.shape[0]
    if std.shape != (rows,) or uniform.shape != (rows,):
        raise ValueError(f"reflection_coupling: std {tuple(std.shape)} and uniform {tuple(uniform.shape)} must be "
                         f"({rows},)")
    view = (rows,) + (1,) * (draft.dim() - 1)
    s = std.float().view(view)
    d = (target_mean.float() - draft_mean.float()) / s
    z = noise.float()
    delta = _row_dot(d, d).sqrt()
    log_ratio = _row_dot(z, d) - 0.5 * delta**2
    accepted = (uniform.double().log() <= log_ratio.clamp(max=0.0)) | (delta < DELTA_EPS)
    e = d / delta.clamp_min(DELTA_EPS).to(d.dtype).view(view)
    reflected_noise = z - 2 * _row_dot(e, z).to(z.dtype).view(view) * e
    reflected = (target_mean.float() + s * reflected_noise).to(draft.dtype)
    sample = torch.where(accepted.view(view), draft, reflected)
    return CouplingResult(accepted, sample, log_ratio, delta)


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
