"""`coupling` with the experimental forecast draft: the forecast machinery and its acceptance.

The exactness (two-sample) and planted-bias tests of ``draft="forecast"`` are parametrized with the
other drafts' in tests/pipelines/test_exact_sampling.py.
"""

import pytest
import torch
from diffusers import DDPMScheduler

from diffspec import CouplingConfig, SpeculativePipeline
from diffspec.schedulers.forecast_draft import ForecastDraftSampler
from diffspec.schedulers.gaussian import GaussianTransition
from diffspec.schedulers.speculative import SpeculativeSampler
from diffspec.stats import SpecStats


def _linear_x0_denoiser(kernel, start, slope):
    """A model whose clean-sample prediction is ``start + step * slope`` whatever the state."""

    def denoise(x, steps, traj):
        a = kernel.a_t[steps].view(-1, 1, 1, 1)
        x0 = start[traj] + steps.view(-1, 1, 1, 1).float() * slope[traj]
        return (x - a**0.5 * x0) / (1 - a) ** 0.5

    return denoise


@pytest.mark.parametrize("batch", [1, 3])
def test_an_order_one_forecast_is_perfect_when_x0_moves_linearly(batch):
    """Anchors, their steps and the weights are right: after the first round (one anchor, a constant
    forecast) every draft is accepted, per trajectory, while freezing x0 keeps being rejected."""
    kernel = GaussianTransition(DDPMScheduler(clip_sample=False), 60)  # clipping would bend the line
    g = torch.Generator().manual_seed(0)
    start, slope = torch.randn(batch, 4, 4, 4, generator=g), 0.05 * torch.randn(batch, 4, 4, 4, generator=g)
    denoise = _linear_x0_denoiser(kernel, start, slope)
    x = torch.randn(batch, 4, 4, 4, generator=g)
    rejected = {}
    for draft in ("forecast", "x0"):
        stats = SpecStats()
        config = CouplingConfig(lookahead=4, draft=draft)
        cls = ForecastDraftSampler if draft == "forecast" else SpeculativeSampler
        out = cls(kernel, denoise, config, stats).sample(x.clone(), [torch.Generator().manual_seed(i)
                                                                     for i in range(batch)])
        assert torch.isfinite(out).all()
        rejected[draft] = stats.proposed - stats.accepted
    assert rejected["forecast"] <= batch  # at most the first round's rejection, per trajectory
    assert rejected["x0"] > 3 * batch


@pytest.mark.slow
def test_forecast_of_x0_is_accepted_far_more_than_forecast_of_the_raw_output():
    """On the trained tiny-dit (DDPM, epsilon model): the raw output tracks the noise, so forecasting
    it is nearly never accepted; forecasting x0 is, though here still below freezing x0."""
    from diffspec.bench.exact_diffusion import _pipeline

    trained, _ = _pipeline("tiny-dit", torch.device("cpu"), torch.float32)
    rates = {}
    for draft in ("x0", "forecast", "forecast-output"):
        spec = SpeculativePipeline.from_pipe(trained, method="coupling", lookahead=4, draft=draft)
        spec(class_labels=list(range(8)), num_inference_steps=40, guidance_scale=4.0, output_type="latent",
             generator=[torch.Generator().manual_seed(s) for s in range(8)])
        rates[draft] = spec.stats.acceptance_rate
    assert rates["forecast"] > 0.3 and rates["forecast-output"] < 0.15, rates
    assert rates["forecast"] > 3 * rates["forecast-output"], rates


def test_forecast_config_is_validated():
    with pytest.raises(ValueError, match=r"forecast_order=0 is out of range"):
        CouplingConfig(draft="forecast", forecast_order=0)
    with pytest.raises(ValueError, match=r"ForecastDraftSampler needs"):
        ForecastDraftSampler(GaussianTransition(DDPMScheduler(), 10), lambda x, s, t: x, CouplingConfig(), SpecStats())
