"""Two-sample tests for exactness claims: energy distance (permutation) and per-coordinate KS.

An exact sampler's outputs must be indistinguishable from the plain sampler's at the same
settings. :func:`same_law` runs both tests with a Bonferroni correction and returns the p-values,
so a test can assert them and a benchmark can report them.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> report = same_law(torch.randn(300, 4, generator=g), torch.randn(300, 4, generator=g))
    >>> report["passed"]
    True
"""

from __future__ import annotations

from typing import Any

import torch


def energy_distance_test(x: torch.Tensor, y: torch.Tensor, permutations: int = 1999,
                         seed: int = 0) -> dict[str, float]:
    """Energy distance between samples ``x`` (n, ...) and ``y`` (m, ...) and its permutation p-value.

    The smallest attainable p-value is ``1 / (permutations + 1)``. All permutations are scored
    with one matrix product against the pairwise distance matrix.
    """
    x, y = x.flatten(1).double(), y.flatten(1).double()
    n = x.shape[0]
    z = torch.cat([x, y])
    dist = torch.cdist(z, z).float()
    total = z.shape[0]
    row_sums = dist.sum(1)

    def statistic(in_x: torch.Tensor) -> torch.Tensor:  # in_x: (P, total) bool
        wx = in_x.float()
        nx = wx.sum(1)
        ny = total - nx
        wd = wx @ dist  # (P, total): distances from each point to the x-group
        xx = (wd * wx).sum(1)
        xy = (wd * (1 - wx)).sum(1)
        yy = row_sums.sum() - 2 * xy - xx
        return (2 * xy / (nx * ny) - xx / (nx * nx) - yy / (ny * ny)).double()

    observed = statistic(torch.arange(total).view(1, -1) < n)[0]
    g = torch.Generator().manual_seed(seed)
    null = torch.cat([statistic(torch.stack([torch.randperm(total, generator=g) < n
                                             for _ in range(min(500, permutations - i))]))
                      for i in range(0, permutations, 500)])
    p = (1 + (null >= observed - 1e-12 * abs(float(observed))).sum().item()) / (1 + permutations)
    return {"energy_distance": float(observed), "p_value": p, "permutations": permutations}


def coordinate_ks_test(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Two-sample KS per coordinate; the smallest p-value, Bonferroni-corrected over coordinates."""
    from scipy import stats

    a, b = x.flatten(1).double().numpy(), y.flatten(1).double().numpy()
    pvalues = stats.ks_2samp(a, b, axis=0).pvalue
    d = a.shape[1]
    return {"min_p": float(pvalues.min()), "bonferroni_p": float(min(1.0, pvalues.min() * d)), "coordinates": d}


def same_law(x: torch.Tensor, y: torch.Tensor, alpha: float = 1e-3, permutations: int = 1999) -> dict[str, Any]:
    """Both tests at level ``alpha`` (each); ``passed`` when neither rejects."""
    energy = energy_distance_test(x, y, permutations)
    ks = coordinate_ks_test(x, y)
    passed = energy["p_value"] > alpha and ks["bonferroni_p"] > alpha
    return {"energy": energy, "ks": ks, "alpha": alpha, "passed": bool(passed), "n": [len(x), len(y)]}
