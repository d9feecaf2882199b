"""Exact speculative sampling inside ComfyUI's sampler contract (``SAMPLER`` / ``KSAMPLER``).

ComfyUI's ``SamplerCustom`` and ``SamplerCustomAdvanced`` call a ``KSAMPLER``'s function as
``fn(model, x, sigmas, extra_args=..., callback=..., disable=..., **extra_options)``, where
``model(x, sigma_rows, **extra_args)`` returns the guided denoised sample ``x0`` for every row at that
row's own sigma. That is the loop a speculative sampler needs: :func:`sample_speculative` runs
:class:`~diffspec.schedulers.speculative.SpeculativeSampler` on a
:class:`~diffspec.schedulers.sigma.SigmaTransition` of ComfyUI's ``euler_ancestral`` (including its
rectified-flow form for ``CONST`` models) or ``ddpm`` step. The drafted states of a round go to the
model as one batch with per-row sigmas; the output has the plain ComfyUI sampler's law.

Rows are laid out in blocks of the latent batch (block ``k`` holds each trajectory's ``k``-th
row), so ComfyUI's ``repeat_to_batch_size`` tiles per-sample conditioning onto the right rows;
trajectories with fewer rows in a round are padded with a copy of one of their rows (computed,
then dropped). With a latent batch of 1 there is no padding.

Example:
    >>> run = SpeculativeRun()
    >>> out = sample_speculative(model, noise, sigmas, extra_args={"seed": 0}, run=run)  # doctest: +SKIP
    >>> run.summary()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import CouplingConfig
from ..progress import progress
from ..schedulers.sigma import SigmaTransition
from ..schedulers.speculative import SpeculativeSampler, plain_sample
from ..stats import SpecStats

logger = logging.getLogger("diffspec")


@dataclass
class SpeculativeRun:
    """Statistics of a speculative SAMPLER's runs (kept on the SAMPLER, read by the stats node).

    Attributes:
        stats: the latest run's :class:`~diffspec.stats.SpecStats` (``target_calls``: sequential model
            calls; ``target_evals``: model rows per trajectory; ``accepted`` / ``proposed``: coupled drafts;
            ``extra``: steps, sampler, ``padded_rows`` and the per-depth acceptance).
        runs: sampling runs so far.
    """

    stats: SpecStats = field(default_factory=lambda: SpecStats(method="coupling"))
    runs: int = 0

    def summary(self) -> str:
        """One line: steps, model calls and acceptance of the latest run."""
        s = self.stats
        steps = s.extra.get("steps", 0)
        ratio = steps / s.target_calls if s.target_calls else 0.0
        return (f"diffspec coupling ({s.extra.get('sampler', '?')}): {steps} steps in {s.target_calls} sequential "
                f"model calls ({ratio:.2f}x fewer), {s.target_evals:.1f} rows per sample, accepted "
                f"{s.accepted}/{s.proposed} drafts ({100 * s.acceptance_rate:.1f}%), {s.wall_s:.2f} s")


def is_flow(model: Any) -> bool:
    """Whether a ComfyUI sampler ``model`` uses rectified-flow (``CONST``) sampling, the test ComfyUI's
    ``sample_euler_ancestral`` makes (duck-typed on the class name so that no ``comfy`` import is needed)."""
    inner = getattr(getattr(model, "inner_model", None), "inner_model", None)
    sampling = getattr(inner, "model_sampling", None)
    return any(cls.__name__ == "CONST" for cls in type(sampling).__mro__)


def noise_generator(x: torch.Tensor, seed: int | None) -> torch.Generator:
    """The generator ComfyUI's ``default_noise_sampler`` draws step noise from (``seed + 1`` on CPU)."""
    generator = torch.Generator(device=x.device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed + 1 if x.device.type == "cpu" else seed)
    return generator


def block_layout(traj: torch.Tensor, batch: int, depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Place rows in blocks of ``batch``: row ``r`` (the ``k``-th of trajectory ``t``) goes to slot ``k * batch + t``.

    Args:
        traj: ``(R,)`` long, the trajectory of each row.
        batch: the latent batch size.
        depth: the most rows of one trajectory, if the caller already read it (else one host read here).

    Returns:
        ``(source, slot)``: ``source`` ``(depth * batch,)`` the row that fills each slot (empty slots
        repeat the trajectory's first row, or row 0), ``slot`` ``(R,)`` each row's slot.

    Example:
        >>> block_layout(torch.tensor([0, 0, 1]), 2)
        (tensor([0, 2, 1, 2]), tensor([0, 2, 1]))
    """
    rows = traj.numel()
    counts = torch.bincount(traj, minlength=batch)
    depth = int(counts.max()) if depth is None else depth  # the call's row count
    order = torch.sort(traj, stable=True).indices
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(traj)
    rank[order] = torch.arange(rows, device=traj.device) - starts[traj[order]]
    slot = rank * batch + traj
    first = torch.where(counts > 0, order[starts.clamp(max=rows - 1)], torch.zeros_like(starts))
    source = first.repeat(depth)
    source[slot] = torch.arange(rows, device=traj.device)
    return source, slot


def _denoiser(model: Callable[..., torch.Tensor], kernel: SigmaTransition, extra_args: dict[str, Any], batch: int,
              callback: Callable[[dict[str, Any]], None] | None, stats: SpecStats):
    """``denoise(x, steps, traj)`` for the speculative sampler: one ComfyUI model call in block layout."""

    def denoise(x: torch.Tensor, steps: torch.Tensor, traj: torch.Tensor) -> torch.Tensor:
        traj, steps = traj.to(x.device), steps.to(x.device)
        # one host read: the call's rows per trajectory and its earliest step (block 0 holds each
        # trajectory's current state, the first of its rows, so that is where ComfyUI's preview looks)
        depth, i = torch.stack([torch.bincount(traj, minlength=batch).max(), steps.min()]).tolist()
        source, slot = block_layout(traj, batch, depth)
        rows = x[source]
        out = model(rows, kernel.sigmas[steps[source]], **extra_args)
        stats.extra["padded_rows"] = stats.extra.get("padded_rows", 0) + source.numel() - x.shape[0]
        if callback is not None:
            callback({"x": rows[:batch], "i": i, "sigma": kernel.sigmas[i], "sigma_hat": kernel.sigmas[i],
                      "denoised": out[:batch]})
        return out[slot]

    return denoise


@torch.no_grad()
def sample_speculative(model: Callable[..., torch.Tensor], x: torch.Tensor, sigmas: torch.Tensor,
                       extra_args: dict[str, Any] | None = None, callback: Callable | None = None,
                       disable: bool | None = None, *, kind: str = "euler_ancestral", lookahead: int = 4,
                       adaptive: bool = True, max_lookahead: int = 16, eta: float = 1.0, s_noise: float = 1.0,
                       run: SpeculativeRun | None = None) -> torch.Tensor:
    """Exact speculative ``euler_ancestral`` / ``ddpm`` with ComfyUI's sampler-function signature.

    Args:
        model: ComfyUI's denoiser, ``model(x, sigma_rows, **extra_args) -> x0``.
        x: ``(B, ...)`` the noise, already scaled by the model's ``noise_scaling``.
        sigmas: ``(N + 1,)`` the schedule.
        extra_args: ComfyUI's (``seed`` seeds the step noise as in ComfyUI's ``default_noise_sampler``;
            ``denoise_mask`` needs a latent batch of 1).
        callback: ComfyUI's per-model-call callback (preview, progress bar).
        disable: hide the console progress bar.
        kind, eta, s_noise: the sampler (see :class:`~diffspec.schedulers.sigma.SigmaTransition`).
        lookahead, adaptive, max_lookahead: drafted steps per round (see
            :class:`~diffspec.config.CouplingConfig`); a lookahead that cannot exceed 1 runs the plain sampler.
        run: where the statistics go.

    Returns:
        The final sample, ``(B, ...)``.

    Raises:
        ValueError: invalid settings, a schedule with a deterministic step before a stochastic one, or
            a denoise mask with a latent batch over 1.
    """
    extra_args = {} if extra_args is None else extra_args
    config = CouplingConfig(lookahead=lookahead, adaptive=adaptive, max_lookahead=max_lookahead, draft="x0")
    kernel = SigmaTransition(sigmas.to(x.device), kind, flow=is_flow(model), eta=eta, s_noise=s_noise)
    batch = x.shape[0]
    if extra_args.get("denoise_mask") is not None and batch > 1:
        raise ValueError("diffspec Speculative Sampler: a noise mask (inpainting) needs a latent batch of 1, got "
                         f"{batch}; use batch 1 or a plain sampler")
    run = SpeculativeRun() if run is None else run
    run.stats = stats = SpecStats(method="coupling", extra={"sampler": kernel.name, "steps": kernel.num_steps,
                                                             "eta": eta, "s_noise": s_noise, "padded_rows": 0})
    generator = noise_generator(x, extra_args.get("seed"))
    denoise = _denoiser(model, kernel, extra_args, batch, callback, stats)
    start = time.perf_counter()
    if kernel.num_steps == 0:
        out = x
    elif config.max_lookahead == 1 or (config.lookahead == 1 and not config.adaptive):
        out = plain_sample(kernel, denoise, x, generator, stats)
    else:
        bar = progress(total=kernel.num_steps, disable=disable, desc="diffspec coupling")
        on_progress = lambda k: bar.update(k - bar.n)  # noqa: E731
        out = SpeculativeSampler(kernel, denoise, config, stats).sample(x, generator, on_progress)
        bar.close()
    stats.wall_s = time.perf_counter() - start
    run.runs += 1
    logger.info(run.summary())
    return out
