"""Shared statistics for the ar_image exactness tests (chi-square goodness of fit / homogeneity)."""

from __future__ import annotations

import torch
from scipy import stats


def chi2_fit(samples: torch.Tensor, law: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Chi-square of integer ``samples`` (cell indices) against ``law``; sparse cells pooled.

    Returns ``(statistic, degrees of freedom, p-value)``.
    """
    counts = torch.bincount(samples.reshape(-1), minlength=law.numel()).double()
    expected = law.double() * samples.numel()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return stat, dof, float(stats.chi2.sf(stat, dof))


def chi2_two_sample(a: torch.Tensor, b: torch.Tensor, cells: int, min_count: float = 5.0) -> float:
    """p-value of a chi-square homogeneity test of two samples of cell indices in ``[0, cells)``."""
    ca = torch.bincount(a.reshape(-1), minlength=cells).double()
    cb = torch.bincount(b.reshape(-1), minlength=cells).double()
    big = (ca + cb) >= min_count
    table = torch.stack([torch.cat([ca[big], ca[~big].sum().reshape(1)]),
                         torch.cat([cb[big], cb[~big].sum().reshape(1)])])
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table.numpy(), correction=False)[1])
