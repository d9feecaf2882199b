"""Peer arms of the ``exact-diffusion`` suite: fewer-step ODE solvers and ParaDiGMS-style Picard.

- ``ddim`` / ``dpm-solver++``: the pipeline itself with ``DDIMScheduler`` (eta 0) or
  ``DPMSolverMultistepScheduler`` (``dpmsolver++``, order 2, i.e. 2M) at a few step counts. Both
  are deterministic, so they sample a different (discretized ODE) law: compare them by reference
  FID and class accuracy, the two-sample test against the DDPM baseline is informative only.
- ``picard``: :func:`~diffspec.schedulers.picard.picard_sample` on the same DDPM transition as the
  baseline (window, tolerance), approximate.

Example:
    >>> run = solver_runner(pipe, "ddim", 20, guidance_scale=4.0, num_classes=10)  # doctest: +SKIP
    >>> latents = run([0, 1, 2])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..schedulers.gaussian import GaussianTransition
from ..schedulers.picard import picard_sample
from ..stats import SpecStats

SOLVERS = ("ddim", "dpm-solver++")


def _solver_pipe(pipe: Any, solver: str) -> Any:
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler

    if solver == "ddim":
        scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    elif solver == "dpm-solver++":
        scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, algorithm_type="dpmsolver++",
                                                            solver_order=2)
    else:
        raise ValueError(f"solver={solver!r} is not supported: choose one of {', '.join(SOLVERS)}")
    solver_pipe = type(pipe)(**{**pipe.components, "scheduler": scheduler})
    solver_pipe.labels = getattr(pipe, "labels", None)
    solver_pipe.set_progress_bar_config(disable=True)
    return solver_pipe


def solver_runner(pipe: Any, solver: str, steps: int, *, guidance_scale: float,
                  num_classes: int) -> Callable[[list[int]], torch.Tensor]:
    """``run(seeds) -> final latents`` of the pipeline's own loop with a deterministic solver.

    The final latents are recovered from the pipeline's decoder input (the pipeline decodes
    itself); the VAE is bypassed by an identity hook so no decode is wasted.
    """
    solver_pipe = _solver_pipe(pipe, solver)
    vae = solver_pipe.vae

    def run(seeds: list[int]) -> torch.Tensor:
        captured: list[torch.Tensor] = []
        original = vae.decode

        def keep(latents: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            captured.append(latents * vae.config.scaling_factor)
            return type("Decoded", (), {"sample": latents})()

        vae.decode = keep  # type: ignore[method-assign]
        try:
            solver_pipe(class_labels=[s % num_classes for s in seeds], num_inference_steps=steps,
                        generator=torch.Generator(pipe._execution_device).manual_seed(seeds[0]),
                        guidance_scale=guidance_scale,
                        output_type="pt")
        finally:
            vae.decode = original  # type: ignore[method-assign]
        return captured[0].float().cpu()

    return run


def picard_runner(pipe: Any, steps: int, *, window: int, tol: float, guidance_scale: float, num_classes: int,
                  stats: SpecStats) -> Callable[[list[int]], torch.Tensor]:
    """``run(seeds) -> final latents`` of Picard iteration on the baseline's DDPM transition.

    Initial latents and step noises come from the same generator in the same order as the
    baseline (``spec.plain``), so a seed gives the baseline's trajectory up to the tolerance.
    """
    from diffusers.utils.torch_utils import randn_tensor

    from ..pipelines.coupling import dit_denoiser

    device = pipe._execution_device
    kernel = GaussianTransition(pipe.scheduler, steps, device=device)
    config = pipe.transformer.config

    def run(seeds: list[int]) -> torch.Tensor:
        labels = torch.tensor([s % num_classes for s in seeds], device=device)
        g = torch.Generator(device).manual_seed(seeds[0])  # the baseline's generator, on the run's device
        shape = (len(seeds), config.in_channels, config.sample_size, config.sample_size)
        x = randn_tensor(shape, generator=g, device=device, dtype=torch.float32) * float(kernel.scheduler.init_noise_sigma)
        denoise = dit_denoiser(pipe, labels, guidance_scale)
        denoise.set_timesteps(kernel.timesteps)  # type: ignore[attr-defined]
        stats.reset()
        with torch.no_grad():
            out = picard_sample(kernel, denoise, x, g, window=window, tol=tol, stats=stats)
        return out.float().cpu()

    return run
