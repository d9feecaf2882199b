import math

import torch

from diffspec.bench.quality import PSNR_CAP_DB, psnr, ssim


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
