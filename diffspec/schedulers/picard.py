"""ParaDiGMS-style Picard iteration of a stochastic sampler (Shih et al. 2023): a peer, approximate.

The plain sampler is the chain ``x_{k+1} = x_k + d_k(x_k) + s_k z_k`` with drift
``d_k(x) = mean_k(x) - x``. With the noises ``z_k`` drawn up front, the trajectory is the fixed
point of ``x_{k+1} = x_t0 + sum_{i=t0..k} (d_i(x_i) + s_i z_i)``. Each Picard iteration evaluates
the network on every state of a sliding window ``[t0, t0 + w)`` in **one** batched call (per-row
timesteps), recomputes the window by that cumulative sum, and slides the window past the leading
states whose change was below the tolerance (``||change||^2 / (d s^2) <= tol``, the noise-scaled
rule of ParaDiGMS; at least one state per iteration, which is exact). The whole batch shares
one window (the worst trajectory decides). Sequential calls are iterations, total evaluations
are rows.

It reproduces the plain sampler's trajectory for the same noise up to the tolerance, so it is
approximate (not law-exact for ``tol > 0``); ``tol = 0`` with ``window = 1`` is the plain sampler.

Example:
    >>> out = picard_sample(kernel, denoise, x, generator, window=16, tol=0.1)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from ..stats import SpecStats
from .gaussian import GaussianTransition
from .speculative import Denoise, Generators, draw


def picard_sample(kernel: GaussianTransition, denoise: Denoise, x: torch.Tensor, generator: Generators = None,
                  window: int = 16, tol: float = 0.1, stats: SpecStats | None = None) -> torch.Tensor:
    """Sample from initial noise ``x`` (``(B, ...)``) by sliding-window Picard iteration.

    The step noises are drawn in the plain sampler's order (:func:`~diffspec.schedulers.speculative.
    plain_sample`: one ``(B, ...)`` draw per step), so with the same generator the result converges
    to the plain sampler's output for the same seed as ``tol -> 0``.

    Args:
        kernel: the scheduler's :class:`GaussianTransition`.
        denoise: the guided network (:data:`~diffspec.schedulers.speculative.Denoise`).
        x: initial noise, already scaled by the scheduler's init sigma.
        generator: noise source (one, or one per trajectory).
        window: states evaluated per iteration (``>= 1``).
        tol: convergence tolerance on the noise-scaled squared change (``>= 0``).
        stats: ``target_calls`` (iterations), ``target_evals`` (rows per trajectory) and
            ``extra["picard"]`` (window, tol, iterations) are added.

    Raises:
        ValueError: ``window < 1`` or ``tol < 0``, or a multistep kernel (``kernel.history > 0``).
    """
    if kernel.history:
        raise ValueError(f"picard_sample: {kernel.name} with solver_order={kernel.history + 1} carries a multistep "
                         "history that Picard iteration does not; use solver_order=1")
    if window < 1:
        raise ValueError(f"window={window} is out of range: allowed [1, inf)")
    if not tol >= 0:
        raise ValueError(f"tol={tol} is out of range: allowed [0, inf)")
    n_steps, batch, dev = kernel.num_steps, x.shape[0], x.device
    per_step = (-1, 1, *[1] * (x.dim() - 1))  # (w, B, ...) broadcast of a per-step scalar
    noise = torch.stack([draw("normal", tuple(x.shape[1:]), generator, torch.arange(batch), dev)
                         for _ in range(n_steps)])  # (N, B, ...)
    std = kernel.std.to(dev)
    scale = torch.where(std > 0, std, std[std > 0].min() if bool((std > 0).any()) else torch.ones(())) ** 2
    traj = torch.arange(batch, device=dev).repeat(window)
    states = x.float().unsqueeze(0).repeat(n_steps + 1, *[1] * x.dim())  # (N + 1, B, ...): x_0 .. x_N
    start, iterations, rows = 0, 0, 0
    while start < n_steps:
        w = min(window, n_steps - start)
        steps = torch.arange(start, start + w, device=dev).repeat_interleave(batch)
        flat = states[start : start + w].reshape(w * batch, *x.shape[1:])
        out = denoise(kernel.model_input(flat.to(x.dtype), steps), steps, traj[: w * batch])
        drift = (kernel.mean(flat, steps, out).float() - flat).view(w, batch, *x.shape[1:])
        incr = drift + std[start : start + w].view(per_step) * noise[start : start + w]
        new = states[start] + incr.cumsum(0)  # x_{start+1} .. x_{start+w}
        change = (new - states[start + 1 : start + w + 1]).flatten(2).pow(2).mean(2).amax(1)  # (w,) worst row
        ratio = change / scale[start : start + w]
        states[start + 1 : start + w + 1] = new
        iterations, rows = iterations + 1, rows + w
        over = (ratio > tol).nonzero()
        stride = max(1, int(over[0]) if len(over) else w)  # the iteration's one host read
        if start + stride < n_steps:  # states after the converged prefix start from the newest value
            states[start + w + 1 :] = states[start + w]
        start += stride
    if stats is not None:
        stats.target_calls += iterations
        stats.target_evals += rows
        stats.extra["picard"] = {"window": window, "tol": tol, "iterations": iterations}
    return states[-1].to(x.dtype)
