"""GaussianTransition equals scheduler.step() given the same noise, at every step, with no hidden state."""

import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
)
from diffusers.utils.torch_utils import randn_tensor

from diffspec.schedulers.gaussian import GaussianTransition

STEPS = 12
CASES = [
    (DDPMScheduler, {}, 1.0),
    (DDPMScheduler, {"variance_type": "fixed_large", "prediction_type": "v_prediction"}, 1.0),
    (DDPMScheduler, {"clip_sample": True, "prediction_type": "sample"}, 1.0),
    (DDIMScheduler, {}, 1.0),
    (DDIMScheduler, {"prediction_type": "v_prediction", "set_alpha_to_one": False}, 0.5),
    (EulerAncestralDiscreteScheduler, {}, 1.0),
    (EulerAncestralDiscreteScheduler, {"prediction_type": "v_prediction"}, 1.0),
]


@pytest.mark.parametrize("cls,config,eta", CASES)
def test_transition_equals_scheduler_step_with_the_same_noise(cls, config, eta):
    scheduler = cls(**config)
    kernel = GaussianTransition(scheduler, STEPS, eta=eta)
    scheduler.set_timesteps(STEPS)
    assert torch.equal(kernel.timesteps, scheduler.timesteps)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=g) * float(getattr(scheduler, "init_noise_sigma", 1.0))
    for i, t in enumerate(scheduler.timesteps):
        steps = torch.full((2,), i)
        out = torch.randn(2, 4, 8, 8, generator=g)
        assert torch.allclose(kernel.model_input(x, steps), scheduler.scale_model_input(x, t))
        seed = 100 + i
        if cls is DDIMScheduler:
            noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(seed))
            expected = scheduler.step(out, t, x, eta=eta, variance_noise=noise).prev_sample
        else:
            noise = randn_tensor(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
            expected = scheduler.step(out, t, x, generator=torch.Generator().manual_seed(seed)).prev_sample
        mean, std = kernel.mean(x, steps, out), kernel.std[steps].view(-1, 1, 1, 1)
        got = mean + std * noise
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), (i, (got - expected).abs().max())
        x = expected
    assert kernel.std[-1] == 0 if cls is not EulerAncestralDiscreteScheduler else kernel.std[-1] >= 0


@pytest.mark.parametrize("cls,config,eta", CASES)
def test_rows_at_different_steps_match_rows_one_by_one_and_draft_mean_is_affine(cls, config, eta):
    kernel = GaussianTransition(cls(**config), STEPS, eta=eta)
    g = torch.Generator().manual_seed(1)
    x, out = torch.randn(3, 4, 6, 6, generator=g), torch.randn(3, 4, 6, 6, generator=g)
    steps = torch.tensor([0, 5, 10])
    together = kernel.mean(x, steps, out)
    alone = torch.cat([kernel.mean(x[i : i + 1], steps[i : i + 1], out[i : i + 1]) for i in range(3)])
    assert torch.allclose(together, alone)
    x0 = kernel.x0(x, steps, out)
    if not (cls is DDIMScheduler and kernel.scheduler.config.clip_sample):  # DDIM's eps is the unclipped output
        assert torch.allclose(kernel.draft_mean(x, steps, x0), together, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scheduler,match", [
    (DDIMScheduler(), "eta=0"),
    (EulerDiscreteScheduler(), "EulerDiscreteScheduler is deterministic"),
    (FlowMatchEulerDiscreteScheduler(), "FlowMatchEulerDiscreteScheduler"),
    (DPMSolverMultistepScheduler(), "DPMSolverMultistepScheduler"),
])
def test_deterministic_schedulers_are_refused_with_the_supported_list(scheduler, match):
    with pytest.raises(ValueError, match=match) as err:
        GaussianTransition(scheduler, 10, eta=0.0)
    assert "DDPMScheduler" in str(err.value)


def test_learned_variance_is_refused():
    with pytest.raises(ValueError, match="variance_type='learned_range'"):
        GaussianTransition(DDPMScheduler(variance_type="learned_range"), 10)


def test_stochastic_steps_and_the_original_scheduler_is_untouched():
    scheduler = DDPMScheduler()
    kernel = GaussianTransition(scheduler, 20)
    assert kernel.stochastic_steps() == 19 and scheduler.num_inference_steps is None
