"""Image quality against the same-seed full-compute output: PSNR and SSIM."""

from __future__ import annotations

import torch

PSNR_CAP_DB = 100.0
"""PSNR reported for identical outputs (instead of infinity, which JSON cannot hold)."""


def psnr(images: torch.Tensor, reference: torch.Tensor, data_range: float | None = None) -> float:
    """Mean per-sample PSNR (dB) of ``images`` against ``reference``; identical samples count as 100 dB.

    ``data_range`` defaults to the reference's value range (1.0 for images in [0, 1]).

    Example:
        >>> psnr(torch.zeros(2, 3, 4, 4), torch.zeros(2, 3, 4, 4))
        100.0
    """
    if images.shape != reference.shape:
        raise ValueError(f"psnr: shapes differ, {tuple(images.shape)} vs {tuple(reference.shape)}")
    a, b = images.detach().double().flatten(1), reference.detach().double().flatten(1)
    rng = float(b.max() - b.min()) if data_range is None else data_range
    mse = (a - b).pow(2).mean(1)
    db = torch.where(mse > 0, 10 * torch.log10(rng**2 / mse.clamp_min(1e-300)), torch.full_like(mse, PSNR_CAP_DB))
    return round(float(db.clamp(max=PSNR_CAP_DB).mean()), 3)


def ssim(images: torch.Tensor, reference: torch.Tensor, data_range: float = 1.0) -> float | None:
    """Mean SSIM of (N, C, H, W) images against ``reference`` (None for non-image tensors)."""
    if images.ndim != 4 or min(images.shape[-2:]) < 7:
        return None
    from torchmetrics.functional.image import structural_similarity_index_measure

    value = structural_similarity_index_measure(images.detach().float().cpu(), reference.detach().float().cpu(),
                                                data_range=data_range)
    return round(float(value), 5)
