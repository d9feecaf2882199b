"""Gaussian reflection maximal coupling of drafted steps, fused over ``[K, C, H, W]`` rows.

The coupling of :mod:`diffspec.speculation.coupling` (the math and its proof live there;
:func:`reflection_coupling_reference` is its torch reference): with
``D = (b - a) / s`` and ``delta = ||D||`` per row, ``log r = <z, D> - delta^2 / 2``; accept the
draft ``y`` when ``log u <= min(0, log r)`` (or ``delta < 1e-8``), else output the reflection
``b + s (z - 2 <e, z> e)``, ``e = D / delta``.

The Triton path runs two passes: pass 1 reads ``z, a, b`` once and writes per-block fp64 partial
sums of ``<D, D>`` and ``<z, D>`` (fp32 elementwise arithmetic, fp64 products and sums, as the
reference), reduced per row by torch in fp64; a few ``[rows]`` torch ops decide acceptance; pass 2
writes the sample (the draft where accepted, the reflection otherwise). It uses
``<e, z> = <z, D> / delta`` instead of re-reducing ``e * z``: equal to the reference's value up to
fp64 rounding (relative 1e-15), i.e. the reflected samples agree to ~1 fp32 ulp.

Example:
    >>> a, b = torch.zeros(1, 8), torch.full((1, 8), 0.1)
    >>> z = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    >>> out = reflection_coupling(a + z, z, a, b, torch.ones(1), torch.rand(1))
    >>> out.sample.shape, out.accepted.dtype
    (torch.Size([1, 8]), torch.bool)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .dispatch import use_triton

DELTA_EPS = 1e-8
"""Below this distance the two laws are treated as equal (always accept)."""


class Coupled(NamedTuple):
    """Per-row outcome: ``accepted`` ``(R,)`` bool, ``sample`` ``(R, ...)``, ``log_ratio`` and ``delta`` ``(R,)`` fp64."""

    accepted: torch.Tensor
    sample: torch.Tensor
    log_ratio: torch.Tensor
    delta: torch.Tensor


def _row_dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.double() * y.double()).flatten(1).sum(1)


def _check(draft: torch.Tensor, noise: torch.Tensor, draft_mean: torch.Tensor, target_mean: torch.Tensor,
           std: torch.Tensor, uniform: torch.Tensor) -> None:
    if not (draft.shape == noise.shape == draft_mean.shape == target_mean.shape):
        raise ValueError(f"reflection_coupling: draft {tuple(draft.shape)}, noise {tuple(noise.shape)}, draft_mean "
                         f"{tuple(draft_mean.shape)} and target_mean {tuple(target_mean.shape)} must have one shape")
    rows = draft.shape[0]
    if std.shape != (rows,) or uniform.shape != (rows,):
        raise ValueError(f"reflection_coupling: std {tuple(std.shape)} and uniform {tuple(uniform.shape)} must be "
                         f"({rows},)")


def decide(dd: torch.Tensor, zd: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(accepted, log_ratio, delta)`` from the fp64 row sums ``<D, D>`` and ``<z, D>``."""
    delta = dd.sqrt()
    log_ratio = zd - 0.5 * delta**2
    accepted = (uniform.double().log() <= log_ratio.clamp(max=0.0)) | (delta < DELTA_EPS)
    return accepted, log_ratio, delta


def reflection_coupling_reference(draft: torch.Tensor, noise: torch.Tensor, draft_mean: torch.Tensor,
                                  target_mean: torch.Tensor, std: torch.Tensor, uniform: torch.Tensor) -> Coupled:
    """Torch reference of :func:`reflection_coupling` (fp32 arithmetic, fp64 row reductions)."""
    view = (draft.shape[0],) + (1,) * (draft.dim() - 1)
    s = std.float().view(view)
    d = (target_mean.float() - draft_mean.float()) / s
    z = noise.float()
    accepted, log_ratio, delta = decide(_row_dot(d, d), _row_dot(z, d), uniform)
    e = d / delta.clamp_min(DELTA_EPS).to(d.dtype).view(view)
    reflected_noise = z - 2 * _row_dot(e, z).to(z.dtype).view(view) * e
    reflected = (target_mean.float() + s * reflected_noise).to(draft.dtype)
    return Coupled(accepted, torch.where(accepted.view(view), draft, reflected), log_ratio, delta)


def reflection_coupling(draft: torch.Tensor, noise: torch.Tensor, draft_mean: torch.Tensor,
                        target_mean: torch.Tensor, std: torch.Tensor, uniform: torch.Tensor, *,
                        backend: str | None = None) -> Coupled:
    """Couple each drafted Gaussian step (row) with the target's ``N(target_mean, std^2 I)``.

    Args:
        draft: ``(R, ...)`` drafted samples ``draft_mean + std * noise`` (kept bit for bit where accepted).
        noise: ``(R, ...)`` the standard normal noise of the draft.
        draft_mean: ``(R, ...)`` the draft's mean.
        target_mean: ``(R, ...)`` the target's mean.
        std: ``(R,)`` shared standard deviation per row (``> 0``).
        uniform: ``(R,)`` independent ``U(0, 1)`` draws.
        backend: ``None`` (auto), ``"torch"`` or ``"triton"``.

    Returns:
        :class:`Coupled` (``accepted``, ``sample``, ``log_ratio``, ``delta``).
    """
    _check(draft, noise, draft_mean, target_mean, std, uniform)
    if draft.dim() < 2 or not use_triton([draft, noise, draft_mean, target_mean, std, uniform], backend):
        return reflection_coupling_reference(draft, noise, draft_mean, target_mean, std, uniform)
    from ._coupling_triton import reflection_coupling_triton

    return reflection_coupling_triton(draft, noise, draft_mean, target_mean, std, uniform)
