"""Transition tables of the flow-matching and DPM-Solver SDE schedulers, for :class:`GaussianTransition`.

Each scheduler here samples ``x' = c_x x + c_x0 x0 + std z`` with ``x0 = (k_x x + k_out out) / k_div``
(``out``: the model output; ``k_div`` only where the scheduler divides), i.e. an affine Gaussian transition whose std depends
on the step only. :func:`sde_tables` reads the per-step coefficients off a scheduler whose
``set_timesteps`` has run, computed as its ``step()`` computes them (float32 tables).

- ``FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)``: ``x0 = x - s v``,
  ``x' = (1 - s') x0 + s' z``.
- ``LTXEulerAncestralRFScheduler`` (``eta > 0``, ``s_noise > 0``): with ``s_d = s' (1 + (s'/s - 1) eta)``,
  ``a' = 1 - s'``, ``a_d = 1 - s_d``: ``x' = a'/a_d [(s_d/s) x + (1 - s_d/s) x0] + s_noise
  sqrt(s'^2 - s_d^2 a'^2 / a_d^2) z``; the last step (``s' = 0``) returns ``x0``.
- ``DPMSolverMultistepScheduler`` / ``DPMSolverSinglestepScheduler`` with ``algorithm_type=
  "sde-dpmsolver++"`` (or ``"sde-dpmsolver"``, multistep only) and ``solver_order=1``: the
  first-order SDE-DPM-Solver step. Higher orders mix earlier model outputs into the mean, which a
  one-state Markov kernel cannot express: they are refused naming ``solver_order=1``.

Example:
    >>> from diffusers import FlowMatchEulerDiscreteScheduler
    >>> s = FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)
    >>> s.set_timesteps(4)
    >>> sorted(sde_tables(s))
    ['c_x', 'c_x0', 'k_out', 'k_x', 'std']
"""

from __future__ import annotations

from typing import Any

import torch

SDE_SCHEDULERS = ("FlowMatchEulerDiscreteScheduler", "LTXEulerAncestralRFScheduler", "DPMSolverMultistepScheduler",
                  "DPMSolverSinglestepScheduler")
SDE_SUPPORTED = ("FlowMatchEulerDiscreteScheduler (stochastic_sampling=True)",
                 "LTXEulerAncestralRFScheduler (eta > 0)",
                 "DPMSolverMultistepScheduler / DPMSolverSinglestepScheduler "
                 "(algorithm_type='sde-dpmsolver++', solver_order=1)")
"""What :func:`sde_tables` supports, for error messages."""


class DeterministicScheduler(ValueError):
    """The scheduler's configuration samples no noise (the caller words the error)."""


def sde_tables(scheduler: Any) -> dict[str, torch.Tensor]:
    """Per-step ``(N,)`` float32 tables ``k_x, k_out`` (and ``k_div``) for ``x0``, ``c_x, c_x0`` and ``std``.

    Args:
        scheduler: one of :data:`SDE_SCHEDULERS`, after ``set_timesteps``.

    Raises:
        DeterministicScheduler: a configuration that adds no noise.
        ValueError: a stochastic configuration that is not a one-state Gaussian kernel (names the fix).
    """
    name = type(scheduler).__name__
    if name == "FlowMatchEulerDiscreteScheduler":
        return _flow_match(scheduler)
    if name == "LTXEulerAncestralRFScheduler":
        return _ltx(scheduler)
    if name in ("DPMSolverMultistepScheduler", "DPMSolverSinglestepScheduler"):
        return _dpm(scheduler)
    raise DeterministicScheduler(name)


def _flow_x0(sigma: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"k_x": torch.ones_like(sigma), "k_out": -sigma}


def _float32(tables: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in tables.items()}


def _flow_match(scheduler: Any) -> dict[str, torch.Tensor]:
    if not scheduler.config.get("stochastic_sampling", False):
        raise DeterministicScheduler("stochastic_sampling=False")
    sig = scheduler.sigmas.float()
    sigma, nxt = sig[:-1], sig[1:]
    return _float32({**_flow_x0(sigma), "c_x": torch.zeros_like(sigma), "c_x0": 1 - nxt, "std": nxt})


def _ltx(scheduler: Any) -> dict[str, torch.Tensor]:
    eta, s_noise = float(scheduler.config.eta), float(scheduler.config.s_noise)
    if not (eta > 0 and s_noise > 0):
        raise DeterministicScheduler(f"eta={eta}, s_noise={s_noise}")
    sig = scheduler.sigmas.float()  # step() works in float32: mirror its rounding
    sigma, nxt = sig[:-1], sig[1:]
    down = nxt * (1.0 + (nxt / sigma - 1.0) * eta)
    alpha_next, alpha_down = 1.0 - nxt, 1.0 - down
    ratio = down / sigma
    scale = alpha_next / (alpha_down + 1e-12)
    renoise = (nxt**2 - down**2 * alpha_next**2 / (alpha_down**2 + 1e-12)).clamp(min=0.0).sqrt() * s_noise
    last = nxt.abs() < 1e-8  # the final step returns x0
    c_x = torch.where(last, torch.zeros_like(ratio), scale * ratio)
    c_x0 = torch.where(last, torch.ones_like(ratio), scale * (1.0 - ratio))
    std = torch.where(last, torch.zeros_like(renoise), renoise)
    return _float32({**_flow_x0(sigma), "c_x": c_x, "c_x0": c_x0, "std": std})


def _dpm(scheduler: Any) -> dict[str, torch.Tensor]:
    config = scheduler.config
    algorithm = config.algorithm_type
    if algorithm not in ("sde-dpmsolver++", "sde-dpmsolver"):
        raise DeterministicScheduler(f"algorithm_type={algorithm!r}")
    if config.solver_order != 1:
        raise ValueError(f"{type(scheduler).__name__}(algorithm_type={algorithm!r}, solver_order="
                         f"{config.solver_order}): orders > 1 mix earlier model outputs into the mean, which exact "
                         "speculation does not carry; use solver_order=1 (the first-order SDE-DPM-Solver)")
    if config.get("variance_type") in ("learned", "learned_range"):
        raise ValueError(f"variance_type={config.variance_type!r}: drop the learned-sigma channels before the "
                         "scheduler (the pipelines do) and leave variance_type=None")
    sig = scheduler.sigmas.float()  # step() works in float32: mirror its rounding
    alpha, sigma_t = scheduler._sigma_to_alpha_sigma_t(sig)
    lam = alpha.log() - sigma_t.log()
    a_s, s_s, a_t, s_t = alpha[:-1], sigma_t[:-1], alpha[1:], sigma_t[1:]
    h = lam[1:] - lam[:-1]
    x0_tables = _dpm_x0(config, sig[:-1], a_s, s_s)
    if algorithm == "sde-dpmsolver++":
        c_x = s_t / s_s * torch.exp(-h)
        c_x0 = a_t * (1 - torch.exp(-2.0 * h))
        std = s_t * torch.sqrt(1.0 - torch.exp(-2.0 * h))
    else:  # x' = (a_t/a_s) x - 2 s_t (e^h - 1) eps, eps = (x - a_s x0) / s_s
        c_eps = 2.0 * s_t * torch.expm1(h)
        c_x = a_t / a_s - c_eps / s_s
        c_x0 = c_eps * a_s / s_s
        std = s_t * torch.sqrt(torch.expm1(2.0 * h))
    return _float32({**x0_tables, "c_x": c_x, "c_x0": c_x0, "std": std.nan_to_num(0.0)})


def _dpm_x0(config: Any, sigma: torch.Tensor, alpha_s: torch.Tensor, sigma_s: torch.Tensor
            ) -> dict[str, torch.Tensor]:
    """``x0 = (k_x x + k_out out) / k_div`` for the DPM-Solver prediction types (``convert_model_output``)."""
    prediction = config.prediction_type
    if prediction == "epsilon":
        return {"k_x": torch.ones_like(sigma), "k_out": -sigma_s, "k_div": alpha_s}
    if prediction == "sample":
        return {"k_x": torch.zeros_like(sigma), "k_out": torch.ones_like(sigma)}
    if prediction == "v_prediction":
        return {"k_x": alpha_s, "k_out": -sigma_s}
    if prediction == "flow_prediction":
        return _flow_x0(sigma)
    raise ValueError(f"prediction_type={prediction!r} is not supported; use epsilon, sample, v_prediction or "
                     "flow_prediction")
