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
  first-order SDE-DPM-Solver step.
- ``DPMSolverMultistepScheduler`` with ``solver_order=2`` (``"sde-dpmsolver++"`` also 3, as
  diffusers): the mean adds ``sum_k c_hist[:, k] m_{i-k}`` over the current and previous converted
  model outputs ``m = u_x x + u_x0 x0`` (the scheduler's ``model_outputs``: ``x0`` for ``++``,
  ``eps`` for ``sde-dpmsolver``), with the order diffusers uses at each step (warm-up,
  ``lower_order_final``, ``euler_at_final``). Given that history the step is still Gaussian with a
  step-only std. The singlestep solver's higher orders restart from an older sample: refused.

Example:
    >>> from diffusers import FlowMatchEulerDiscreteScheduler
    >>> s = FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)
    >>> s.set_timesteps(4)
    >>> sorted(sde_tables(s))
    ['c_x', 'c_x0', 'k_out', 'k_x', 'std']
    >>> d = DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=2)  # doctest: +SKIP
    >>> d.set_timesteps(4); sde_tables(d)["c_hist"].shape  # doctest: +SKIP
    torch.Size([4, 2])
"""

from __future__ import annotations

from typing import Any

import torch

SDE_SCHEDULERS = ("FlowMatchEulerDiscreteScheduler", "LTXEulerAncestralRFScheduler", "DPMSolverMultistepScheduler",
                  "DPMSolverSinglestepScheduler")
SDE_SUPPORTED = ("FlowMatchEulerDiscreteScheduler (stochastic_sampling=True)",
                 "LTXEulerAncestralRFScheduler (eta > 0)",
                 "DPMSolverMultistepScheduler / DPMSolverSinglestepScheduler "
                 "(algorithm_type='sde-dpmsolver++'; multistep solver_order 1-3, singlestep 1)")
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
    order = int(config.solver_order)
    name = type(scheduler).__name__
    if order != 1 and (name == "DPMSolverSinglestepScheduler" or order > 3 or (order == 3 and algorithm ==
                                                                                 "sde-dpmsolver")):
        allowed = ("solver_order=1 (singlestep restarts higher orders from an older sample; use "
                   "DPMSolverMultistepScheduler for solver_order 2 or 3)" if name == "DPMSolverSinglestepScheduler"
                   else "solver_order in 1..2 for 'sde-dpmsolver', 1..3 for 'sde-dpmsolver++'")
        raise ValueError(f"{name}(algorithm_type={algorithm!r}, solver_order={order}) is not supported by exact "
                         f"speculation; use {allowed}")
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
        u_x, u_x0 = torch.zeros_like(c_x), torch.ones_like(c_x)  # m = x0
    else:  # x' = (a_t/a_s) x - 2 s_t (e^h - 1) eps, eps = (x - a_s x0) / s_s
        c_eps = 2.0 * s_t * torch.expm1(h)
        c_x = a_t / a_s - c_eps / s_s
        c_x0 = c_eps * a_s / s_s
        std = s_t * torch.sqrt(torch.expm1(2.0 * h))
        u_x, u_x0 = 1.0 / s_s, -a_s / s_s  # m = eps
    tables = {**x0_tables, "c_x": c_x, "c_x0": c_x0, "std": std.nan_to_num(0.0)}
    if order > 1:
        tables.update(u_x=u_x, u_x0=u_x0, c_hist=_dpm_history(scheduler, lam, a_t, s_t, h, order))
    return _float32(tables)


def _dpm_orders(scheduler: Any, n: int) -> torch.Tensor:
    """``(N,)`` the order ``DPMSolverMultistepScheduler.step`` uses at each step index."""
    config, i = scheduler.config, torch.arange(n)
    short = bool(config.lower_order_final) and n < 15
    final = (i == n - 1) & bool(config.euler_at_final or short or config.final_sigmas_type == "zero")
    second = (i == n - 2) & short
    orders = torch.full((n,), int(config.solver_order))
    orders = torch.where((orders > 2) & ((i < 2) | second), torch.full_like(orders, 2), orders)
    return torch.where((i < 1) | final, torch.ones_like(orders), orders)


def _dpm_history(scheduler: Any, lam: torch.Tensor, a_t: torch.Tensor, s_t: torch.Tensor, h: torch.Tensor,
                 order: int) -> torch.Tensor:
    """``(N, order)`` weights of ``m_i, m_{i-1}, ...`` in the mean beyond the first-order part (diffusers'
    ``D1``/``D2`` terms of ``multistep_dpm_solver_{second,third}_order_update``; 0 at first-order steps)."""
    config, n = scheduler.config, h.shape[0]
    orders = _dpm_orders(scheduler, n)
    h0 = torch.cat([h.new_ones(1), lam[1:-1] - lam[:-2]])  # lambda_s0 - lambda_s1 (unused at i = 0)
    h1 = torch.cat([h.new_ones(2), lam[1:-2] - lam[:-3]])[:n]  # lambda_s1 - lambda_s2 (unused at i < 2)
    r0, r1 = h0 / h, h1 / h
    if config.algorithm_type == "sde-dpmsolver++":
        b = a_t * ((1.0 - torch.exp(-2.0 * h)) / (-2.0 * h) + 1.0)  # heun D1 weight (and order 3's)
        d1 = 0.5 * a_t * (1 - torch.exp(-2.0 * h)) if config.solver_type == "midpoint" else b
    else:
        d1 = -s_t * torch.expm1(h) if config.solver_type == "midpoint" else -2.0 * s_t * (torch.expm1(h) / h - 1.0)
    weights = torch.zeros(n, order)
    two = orders == 2  # D1 = (m0 - m1) / r0
    weights[:, 0] = torch.where(two, d1 / r0, 0.0)
    weights[:, 1] = torch.where(two, -d1 / r0, 0.0)
    if order == 3:  # D1 = D1_0 + r0/(r0+r1) (D1_0 - D1_1), D2 = (D1_0 - D1_1)/(r0+r1), D1_k = (m_k - m_{k+1})/r_k
        c = a_t * ((1.0 - torch.exp(-2.0 * h) - 2.0 * h) / (2.0 * h) ** 2 - 0.5)
        p = b * (1 + r0 / (r0 + r1)) + c / (r0 + r1)  # weight of D1_0
        q = -b * r0 / (r0 + r1) - c / (r0 + r1)  # weight of D1_1
        three = orders == 3
        weights[:, 0] = torch.where(three, p / r0, weights[:, 0])
        weights[:, 1] = torch.where(three, -p / r0 + q / r1, weights[:, 1])
        weights[:, 2] = torch.where(three, -q / r1, 0.0)
    return weights.nan_to_num(0.0)


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
