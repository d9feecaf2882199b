"""Multistep SDE-DPM-Solver (orders 2, 3) as a Gaussian transition with a history equals scheduler.step()."""

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler, DPMSolverSinglestepScheduler

from diffspec.schedulers.gaussian import GaussianTransition

CASES = [
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 2}, 10),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 2}, 20),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 2, "solver_type": "heun"}, 20),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 2, "prediction_type": "v_prediction",
      "final_sigmas_type": "sigma_min", "lower_order_final": False}, 16),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 3}, 10),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 3}, 20),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 3, "euler_at_final": True, "thresholding": True}, 20),
    ({"algorithm_type": "sde-dpmsolver", "solver_order": 2, "final_sigmas_type": "sigma_min"}, 12),
    ({"algorithm_type": "sde-dpmsolver", "solver_order": 2, "solver_type": "heun",
      "final_sigmas_type": "sigma_min"}, 20),
    # flow-matching models (SD3 / Wan style): flow sigmas and the velocity prediction
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 2, "use_flow_sigmas": True,
      "prediction_type": "flow_prediction"}, 16),
    ({"algorithm_type": "sde-dpmsolver++", "solver_order": 3, "use_flow_sigmas": True,
      "prediction_type": "flow_prediction", "flow_shift": 3.0}, 20),
]


def run_both(config, steps, seed=0, history_scale=1.0):
    """The scheduler's step() and the kernel with a history, on the same outputs and noise, step by step."""
    scheduler = DPMSolverMultistepScheduler(**config)
    kernel = GaussianTransition(scheduler, steps)
    scheduler.set_timesteps(steps)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 8, 8, generator=g)
    hist = torch.zeros(2, kernel.history, 4, 8, 8)
    worst = 0.0
    for i, t in enumerate(scheduler.timesteps):
        rows = torch.full((2,), i)
        out = torch.randn(2, 4, 8, 8, generator=g)
        noise = torch.randn(2, 4, 8, 8, generator=g)
        expected = scheduler.step(out, t, x, variance_noise=noise).prev_sample
        got = kernel.mean(x, rows, out, hist * history_scale) + kernel.std[rows].view(-1, 1, 1, 1) * noise
        worst = max(worst, float((got - expected).abs().max() / (1 + expected.abs().max())))
        m = kernel.converted(x, rows, kernel.x0(x, rows, out)).unsqueeze(1)
        hist = torch.cat([m, hist[:, :-1]], 1)
        x = expected
    return kernel, worst


@pytest.mark.parametrize("config,steps", CASES)
def test_transition_with_history_equals_scheduler_step_over_a_trajectory(config, steps):
    kernel, worst = run_both(config, steps)
    assert kernel.history == config["solver_order"] - 1
    assert worst < 1e-5, worst


def test_a_wrong_history_is_detected():
    _, worst = run_both(CASES[0][0], 10, history_scale=0.0)  # history dropped
    assert worst > 1e-3, worst


def test_history_is_required_and_unsupported_orders_are_refused():
    kernel = GaussianTransition(DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=2), 10)
    x = torch.zeros(2, 4, 4, 4)
    with pytest.raises(ValueError, match="hist must be"):
        kernel.mean(x, torch.tensor([1, 2]), x)
    with pytest.raises(ValueError, match="solver_order=3"):
        GaussianTransition(DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver", solver_order=3,
                                                       final_sigmas_type="sigma_min"), 10)
    with pytest.raises(ValueError, match="use DPMSolverMultistepScheduler for solver_order 2 or 3"):
        GaussianTransition(DPMSolverSinglestepScheduler(algorithm_type="sde-dpmsolver++", solver_order=2), 10)
