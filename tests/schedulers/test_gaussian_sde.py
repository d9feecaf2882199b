"""The flow-matching and DPM-Solver SDE transitions equal scheduler.step() given the same noise."""

import pytest
import torch
from diffusers import (
    DPMSolverMultistepScheduler,
    DPMSolverSinglestepScheduler,
    FlowMatchEulerDiscreteScheduler,
    LTXEulerAncestralRFScheduler,
)
from diffusers.utils.torch_utils import randn_tensor

from diffspec.schedulers.gaussian import GaussianTransition

STEPS = 10
SDE_DPM = {"algorithm_type": "sde-dpmsolver++", "solver_order": 1}
CASES = [
    (FlowMatchEulerDiscreteScheduler, {"stochastic_sampling": True}),
    (FlowMatchEulerDiscreteScheduler, {"stochastic_sampling": True, "shift": 3.0}),
    (LTXEulerAncestralRFScheduler, {}),
    (LTXEulerAncestralRFScheduler, {"eta": 0.5, "s_noise": 0.9}),
    (DPMSolverMultistepScheduler, SDE_DPM),
    (DPMSolverMultistepScheduler, {**SDE_DPM, "prediction_type": "v_prediction", "thresholding": True}),
    (DPMSolverMultistepScheduler, {**SDE_DPM, "use_flow_sigmas": True, "prediction_type": "flow_prediction"}),
    (DPMSolverMultistepScheduler, {"algorithm_type": "sde-dpmsolver", "solver_order": 1,
                                   "final_sigmas_type": "sigma_min"}),
    (DPMSolverSinglestepScheduler, SDE_DPM),
    (DPMSolverSinglestepScheduler, {**SDE_DPM, "prediction_type": "sample"}),
]


def _step(scheduler, out, t, x, seed):
    """scheduler.step with noise drawn from ``seed``, and that noise."""
    noise = randn_tensor(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    if isinstance(scheduler, DPMSolverMultistepScheduler):
        return scheduler.step(out, t, x, variance_noise=noise).prev_sample, noise
    return scheduler.step(out, t, x, generator=torch.Generator().manual_seed(seed)).prev_sample, noise


@pytest.mark.parametrize("cls,config", CASES)
def test_transition_equals_scheduler_step_with_the_same_noise(cls, config):
    scheduler = cls(**config)
    kernel = GaussianTransition(scheduler, STEPS)
    scheduler.set_timesteps(STEPS)
    assert torch.equal(kernel.timesteps, scheduler.timesteps)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=g)
    for i, t in enumerate(scheduler.timesteps):
        steps = torch.full((2,), i)
        out = torch.randn(2, 4, 8, 8, generator=g)
        if hasattr(scheduler, "scale_model_input"):
            assert torch.equal(kernel.model_input(x, steps), scheduler.scale_model_input(x, t))
        expected, noise = _step(scheduler, out, t, x, 100 + i)
        got = kernel.mean(x, steps, out) + kernel.std[steps].view(-1, 1, 1, 1) * noise
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), (i, (got - expected).abs().max())
        x = expected
    noisy_end = config.get("final_sigmas_type") == "sigma_min"  # the last step also adds noise
    assert bool((kernel.std[:-1] > 0).all()) and bool(kernel.std[-1] > 0) == noisy_end
    assert kernel.stochastic_steps() == STEPS - 1 + noisy_end


@pytest.mark.parametrize("cls,config", CASES)
def test_rows_at_different_steps_match_one_by_one_and_the_draft_mean_is_the_mean(cls, config):
    kernel = GaussianTransition(cls(**config), STEPS)
    g = torch.Generator().manual_seed(1)
    x, out = torch.randn(3, 4, 6, 6, generator=g), torch.randn(3, 4, 6, 6, generator=g)
    steps = torch.tensor([0, 4, 8])
    together = kernel.mean(x, steps, out)
    for row, step in enumerate(steps.tolist()):  # each row as if the whole batch were at its step
        assert torch.allclose(together[row], kernel.mean(x, torch.full((3,), step), out)[row])
    assert torch.equal(kernel.draft_mean(x, steps, kernel.x0(x, steps, out)), together)


@pytest.mark.parametrize("scheduler,match", [
    (FlowMatchEulerDiscreteScheduler(), "stochastic_sampling=False"),
    (LTXEulerAncestralRFScheduler(eta=0.0), "eta=0.0"),
    (DPMSolverMultistepScheduler(algorithm_type="dpmsolver++"), "algorithm_type='dpmsolver\\+\\+'"),
    (DPMSolverSinglestepScheduler(), "DPMSolverSinglestepScheduler with algorithm_type"),
])
def test_deterministic_configurations_are_refused_with_the_supported_list(scheduler, match):
    with pytest.raises(ValueError, match=match) as err:
        GaussianTransition(scheduler, 10)
    assert "is deterministic" in str(err.value) and "stochastic_sampling=True" in str(err.value)


def test_higher_order_singlestep_and_order_4_are_refused_naming_the_supported_orders():
    with pytest.raises(ValueError, match="use solver_order=1"):
        GaussianTransition(DPMSolverSinglestepScheduler(algorithm_type="sde-dpmsolver++", solver_order=2), 10)
    with pytest.raises(ValueError, match="1..3 for 'sde-dpmsolver\\+\\+'"):
        GaussianTransition(DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=4), 10)


def test_dynamic_shifting_takes_the_pipeline_mu():
    scheduler = FlowMatchEulerDiscreteScheduler(stochastic_sampling=True, use_dynamic_shifting=True)
    kernel = GaussianTransition(scheduler, 6, mu=0.8)
    scheduler.set_timesteps(6, mu=0.8)
    assert torch.equal(kernel.timesteps, scheduler.timesteps)
