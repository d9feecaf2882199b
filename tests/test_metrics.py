import math

import numpy as np
import pytest
import torch

from diffspec.metrics import (
    PSNR_CAP_DB,
    frechet_distance,
    lower_prediction_bound,
    psnr,
    ssim,
    student_t_quantile,
)


def test_psnr_identical_is_capped_and_known_value():
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert psnr(x, x) == PSNR_CAP_DB
    y = x + 0.1  # mse 0.01 → 20 dB at range 1
    assert math.isclose(psnr(y, x, data_range=1.0), 20.0, abs_tol=1e-6)


def test_psnr_rejects_shape_mismatch():
    import pytest

    with pytest.raises(ValueError, match="shapes differ"):
        psnr(torch.zeros(1, 3, 4, 4), torch.zeros(1, 3, 4, 5))


def test_ssim_identical_is_one_and_drops_with_noise():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 16, 16, generator=g)
    assert ssim(x, x) > 0.999
    noisy = (x + 0.3 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    assert ssim(noisy, x) < 0.9
    assert ssim(torch.zeros(2, 5, 6), torch.zeros(2, 5, 6)) is None  # not images


def test_frechet_distance_properties():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 8))
    mu, sigma = x.mean(0), np.cov(x, rowvar=False)
    assert abs(frechet_distance(mu, sigma, mu, sigma)) < 1e-6
    assert frechet_distance(mu + 1.0, sigma, mu, sigma) == pytest.approx(8.0, rel=1e-6)
    assert frechet_distance(mu, 4 * sigma, mu, sigma) > 1.0


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 15, 63])
def test_student_t_quantile_matches_scipy(df):
    from scipy import stats

    for p in (0.9, 0.95, 0.99):
        exact = stats.t.ppf(p, df)
        assert abs(student_t_quantile(p, df) - exact) <= 0.004 * exact


def test_lower_prediction_bound_covers_new_draws_at_its_rate():
    """Over many sets of 8 normal draws, a ninth draw falls below the bound about 5% of the time (the worst of 8
    would be beaten 1 time in 9)."""
    gen = torch.Generator().manual_seed(0)
    draws = torch.randn(4000, 9, generator=gen, dtype=torch.float64) * 3 + 40
    below = [float(row[8]) < lower_prediction_bound(row[:8].tolist()) for row in draws]
    below_min = (draws[:, 8] < draws[:, :8].min(1).values).double().mean().item()
    assert 0.035 < sum(below) / len(below) < 0.065 and 0.09 < below_min < 0.13
    assert lower_prediction_bound([41.0]) == 41.0 and lower_prediction_bound([40.0, 40.0]) == 40.0
    with pytest.raises(ValueError, match="no values"):
        lower_prediction_bound([])
    with pytest.raises(ValueError, match="p=0.2"):
        student_t_quantile(0.2, 3)


def test_lower_prediction_bound_counts_shared_prompts_once():
    """8 samples from 4 prompts (2 seeds each; prompts vary 4x more than seeds): counted as 8 independent draws the
    bound misses a new prompt far more often than 5%; counted as 4 it holds its rate."""
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randn(4000, 5, generator=gen, dtype=torch.float64) * 2 + 40
    seeds = torch.randn(4000, 8, generator=gen, dtype=torch.float64) * 0.5
    seen, new = prompts[:, :4].repeat_interleave(2, dim=1) + seeds, prompts[:, 4]
    naive = sum(float(n) < lower_prediction_bound(row.tolist()) for row, n in zip(seen, new)) / len(new)
    grouped = sum(float(n) < lower_prediction_bound(row.tolist(), independent=4) for row, n in zip(seen, new)) / len(new)
    assert naive > 0.08 and grouped < 0.065
    with pytest.raises(ValueError, match="independent=0"):
        lower_prediction_bound([40.0, 41.0], independent=0)
