"""Quality of an output against a reference: PSNR, SSIM and the Fréchet distance behind FID.

Relaxed methods report their loss against the full-compute output of the same seed with these;
:func:`~diffspec.models.classifier.reference_fid` applies :func:`frechet_distance` to the features of
a shipped classifier.

Example:
    >>> import torch
    >>> x = torch.zeros(2, 3, 8, 8)
    >>> psnr(x + 0.1, x, data_range=1.0)
    20.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist, fmean, stdev

import numpy as np
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
    return round(float(psnr_per_sample(images, reference, data_range).mean()), 3)


def psnr_per_sample(images: torch.Tensor, reference: torch.Tensor, data_range: float | None = None) -> torch.Tensor:
    """PSNR (dB) of each sample (first dimension), float64, capped at 100 dB; see :func:`psnr`.

    Example:
        >>> psnr_per_sample(torch.zeros(2, 4), torch.tensor([[0.0] * 4, [0.0, 0.0, 0.0, 1.0]]), 1.0).tolist()
        [100.0, 6.020599913279624]
    """
    if images.shape != reference.shape:
        raise ValueError(f"psnr: shapes differ, {tuple(images.shape)} vs {tuple(reference.shape)}")
    a, b = images.detach().double().flatten(1), reference.detach().double().flatten(1)
    rng = float(b.max() - b.min()) if data_range is None else data_range
    mse = (a - b).pow(2).mean(1)
    db = torch.where(mse > 0, 10 * torch.log10(rng**2 / mse.clamp_min(1e-300)), torch.full_like(mse, PSNR_CAP_DB))
    return db.clamp(max=PSNR_CAP_DB)


def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, ``p`` in [0.5, 1) (closed form for
    ``df`` of 1 and 2, else the Cornish-Fisher expansion to ``1/df**4``: within 0.4% of the exact value for ``p``
    up to 0.99, 0.05% at 0.95).

    Example:
        >>> round(student_t_quantile(0.95, 3), 3), round(student_t_quantile(0.95, 1), 3)
        (2.352, 6.314)
    """
    if not 0.5 <= p < 1.0 or df < 1:
        raise ValueError(f"student_t_quantile: p={p} must be in [0.5, 1) and df={df} at least 1")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(g / df ** (i + 1) for i, g in enumerate(terms))


def lower_prediction_bound(values: Sequence[float], coverage: float = 0.95, independent: int | None = None) -> float:
    """A value a new draw falls below with probability ``1 - coverage``, from ``values`` drawn alike (normal
    prediction interval: ``mean - t * sd * sqrt(1 + 1/n)``), never above their minimum; one value is its own bound.

    ``independent``: how many independent draws the values hold when some share a cause (samples of the same
    prompt at different seeds: the number of distinct prompts). ``n`` and the degrees of freedom of ``t`` are then
    that many (at least 2), so a few prompts seen at many seeds are not mistaken for many prompts.

    Example:
        >>> round(lower_prediction_bound([40.0, 41.0, 42.0, 43.0]), 2)
        38.1
        >>> round(lower_prediction_bound([40.0, 41.0, 42.0, 43.0], independent=2), 2)
        31.52
    """
    if not values:
        raise ValueError("lower_prediction_bound: no values")
    n = len(values)
    if n == 1:
        return float(values[0])
    if independent is not None:
        if independent < 1:
            raise ValueError(f"lower_prediction_bound: independent={independent} must be at least 1")
        n = max(2, min(n, independent))
    bound = fmean(values) - student_t_quantile(coverage, n - 1) * stdev(values) * math.sqrt(1 + 1 / n)
    return float(min(bound, min(values)))


def ssim(images: torch.Tensor, reference: torch.Tensor, data_range: float = 1.0) -> float | None:
    """Mean SSIM of (N, C, H, W) images against ``reference`` (None for non-image tensors).

    Example:
        >>> ssim(torch.ones(1, 3, 8, 8), torch.ones(1, 3, 8, 8))
        1.0
    """
    if images.ndim != 4 or min(images.shape[-2:]) < 7:
        return None
    from torchmetrics.functional.image import structural_similarity_index_measure

    value = structural_similarity_index_measure(images.detach().float().cpu(), reference.detach().float().cpu(),
                                                data_range=data_range)
    return round(float(value), 5)


def _sqrtm_psd(a: np.ndarray) -> np.ndarray:
    vals, vecs = np.linalg.eigh((a + a.T) / 2)
    return (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Fréchet distance between two Gaussians (eigen-decomposition, no scipy needed).

    Uses ``tr(sqrt(S1 S2)) = tr(sqrt(sqrt(S1) S2 sqrt(S1)))``, symmetric and PSD.

    Example:
        >>> frechet_distance(np.ones(2), np.eye(2), np.zeros(2), np.eye(2))
        2.0
    """
    s1_half = _sqrtm_psd(np.asarray(sigma1, dtype=np.float64))
    middle = _sqrtm_psd(s1_half @ np.asarray(sigma2, dtype=np.float64) @ s1_half)
    diff = np.asarray(mu1, dtype=np.float64) - np.asarray(mu2, dtype=np.float64)
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(middle))


def feature_stats(features: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of (n, d) features: the Gaussian :func:`frechet_distance` compares.

    Example:
        >>> mu, sigma = feature_stats(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
        >>> mu.tolist(), sigma.shape
        ([1.0, 2.0], (2, 2))
    """
    f = features.double().numpy()
    return f.mean(0), np.cov(f, rowvar=False)
