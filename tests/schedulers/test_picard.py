"""ParaDiGMS-style Picard iteration: converges to the plain sampler's trajectory for the same noise."""

import pytest
import torch
from diffusers import DDPMScheduler

from diffspec.schedulers.gaussian import GaussianTransition
from diffspec.schedulers.picard import picard_sample
from diffspec.schedulers.speculative import plain_sample
from diffspec.stats import SpecStats


@pytest.fixture(scope="module")
def setup():
    kernel = GaussianTransition(DDPMScheduler(clip_sample=False), 40)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(17, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16))

    def denoise(x, steps, traj):  # a smooth nonlinear epsilon model of (x, t)
        t = kernel.timesteps[steps].float().view(-1, 1) / 1000
        return net(torch.cat([x.flatten(1), t], 1)).view_as(x)

    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = plain_sample(kernel, denoise, x, torch.Generator().manual_seed(2))
    return kernel, denoise, x, plain


@pytest.mark.parametrize("window", [1, 5])
def test_zero_tolerance_is_the_plain_sampler_one_step_per_iteration(setup, window):
    kernel, denoise, x, plain = setup
    stats = SpecStats()
    with torch.no_grad():
        out = picard_sample(kernel, denoise, x, torch.Generator().manual_seed(2), window=window, tol=0.0, stats=stats)
    assert torch.allclose(out, plain, atol=1e-4), (out - plain).abs().max()
    assert stats.target_calls == 40 and stats.extra["picard"]["iterations"] == 40


def test_a_tolerance_takes_fewer_sequential_calls_and_stays_close_to_the_same_seed(setup):
    kernel, denoise, x, plain = setup
    stats = SpecStats()
    with torch.no_grad():
        out = picard_sample(kernel, denoise, x, torch.Generator().manual_seed(2), window=8, tol=1e-3, stats=stats)
    assert stats.target_calls < 40 and stats.target_evals > 40
    assert (out - plain).abs().max() < 0.05 * plain.abs().max()
    with torch.no_grad():  # another seed is a different trajectory: the closeness above is not trivial
        other = picard_sample(kernel, denoise, x, torch.Generator().manual_seed(3), window=8, tol=1e-3)
    assert (other - plain).abs().max() > 0.2 * plain.abs().max()


def test_bad_arguments(setup):
    kernel, denoise, x, _ = setup
    with pytest.raises(ValueError, match="window=0 is out of range"):
        picard_sample(kernel, denoise, x, window=0)
    with pytest.raises(ValueError, match="tol=-1"):
        picard_sample(kernel, denoise, x, tol=-1.0)
