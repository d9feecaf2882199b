"""The ``coupling`` / ``autospec`` methods on diffusers pipelines: exact speculative sampling, same call.

The wrapper owns the denoising loop (the speculative sampler evaluates several steps per network
call) and reuses the pipeline's components and methods: prompt encoding, latent preparation,
transformer, scheduler (read as a pure Gaussian transition), VAE, callbacks and output class
(:mod:`~diffspec.pipelines.prepare`, :mod:`~diffspec.pipelines.prepare_flux`). Supported:
``DiTPipeline``, ``PixArtAlphaPipeline``, ``PixArtSigmaPipeline``, ``StableDiffusion3Pipeline``,
``FluxPipeline``. Callbacks run once per round, at the last step every image has committed (a
round commits one or more steps per image).

Example:
    >>> pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(  # doctest: +SKIP
    ...     pipe.scheduler.config, stochastic_sampling=True)
    >>> spec = SpeculativePipeline.from_pipe(pipe, method="coupling", lookahead=4)  # doctest: +SKIP
    >>> images = spec("a red fox", num_inference_steps=50).images  # doctest: +SKIP
    >>> spec.stats.target_calls  # fewer sequential transformer calls than 50  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from ..api import SpeculativePipeline
from ..config import AutospecConfig, CouplingConfig, MethodConfig
from ..progress import progress
from ..schedulers.autospec import ASD_SCHEDULERS, AutospecSampler
from ..schedulers.forecast_draft import FORECAST_DRAFTS, ForecastDraftSampler
from ..schedulers.gaussian import GaussianTransition
from ..schedulers.speculative import SpeculativeSampler, plain_sample
from .denoisers import dit_denoiser  # noqa: F401  (re-exported: its home before denoisers.py)
from .job import Job
from .prepare import PREPARERS, bind_call, check_pair, sampler_eta

SUPPORTED_PIPELINES = tuple(PREPARERS)


def pair_kernel(pipe: Any, eta: float | None) -> GaussianTransition:
    """The scheduler's transition (2 steps), after checking that the pipeline/scheduler pair is one the
    plain path reproduces (:func:`~diffspec.pipelines.prepare.check_pair`); ``ValueError`` otherwise."""
    kernel = GaussianTransition(pipe.scheduler, 2, eta=1.0 if eta is None else eta,
                                mu=1.0 if pipe.scheduler.config.get("use_dynamic_shifting") else None)
    check_pair(pipe, kernel)
    return kernel


class CouplingPipeline(SpeculativePipeline):
    """A supported pipeline sampled by exact speculative sampling (``coupling`` or ``autospec``).

    The output law equals the plain stochastic sampler's with the same scheduler, steps and
    guidance; ``spec.plain(...)`` runs that sampler, one transformer call a step, and gives the
    unwrapped pipeline's output for the same noise and call arguments. Pairs the pipeline's own
    loop does not run as the scheduler's sampler are refused
    (:func:`~diffspec.pipelines.prepare.check_pair`): Euler-Ancestral on DiT and SD3 (no noise /
    input scaling), DDIM on DiT and SD3 (no ``eta``), flow-matching schedulers on DiT and PixArt
    and schedulers that cannot take Flux's sigma schedule on Flux (the pipeline itself cannot run
    them); deterministic schedulers too. ``DDIMScheduler`` on PixArt is sampled at the call's
    ``eta`` (or ``CouplingConfig.eta``), which must be in ``(0, 1]``.
    """

    family = "diffusion"

    def __init__(self, pipe: Any, config: CouplingConfig | AutospecConfig) -> None:
        super().__init__(pipe, config)
        self.enable()

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig) -> CouplingPipeline:
        name = type(target).__name__
        if name not in SUPPORTED_PIPELINES or not hasattr(target, "transformer"):
            raise ValueError(f"method {config.method!r} supports {', '.join(SUPPORTED_PIPELINES)}; got {name}")
        if not isinstance(config, (CouplingConfig, AutospecConfig)):
            raise ValueError(f"{type(config).__name__} is not an exact sampling config")
        kernel = pair_kernel(target, getattr(config, "eta", None))
        if isinstance(config, AutospecConfig) and kernel.name not in ASD_SCHEDULERS:
            raise ValueError(f"method 'autospec' (ASD) needs {' or '.join(ASD_SCHEDULERS)}; the pipeline has "
                             f"{kernel.name}. "
                             "pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config), or method='coupling'")
        return cls(target, config)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        return self._generate(args, kwargs, plain=False)

    def _generate(self, args: tuple[Any, ...], kwargs: dict[str, Any], plain: bool) -> Any:
        pipe = self.pipe
        bound = bind_call(pipe, args, kwargs)
        pair_kernel(pipe, None)  # the scheduler may have been swapped since from_pipe
        eta = sampler_eta(pipe, bind_call(pipe, args, kwargs, defaults=False), getattr(self.config, "eta", None))
        disable = getattr(pipe, "_progress_bar_config", {}).get("disable", False)
        with torch.no_grad():
            job = PREPARERS[type(pipe).__name__](pipe, bound, eta, pipe._execution_device)
            steps = job.kernel.num_steps
            with progress(total=steps, desc=self.config.method, disable=disable) as bar:
                latents = self._sample(job, plain, bar)
                bar.update(steps - bar.n)
            self.stats.steps = self.stats.full_steps = steps  # every step's output is the target's (SpecStats)
            return job.finish(latents)

    def _sample(self, job: Job, plain: bool, bar: Any) -> torch.Tensor:
        if plain:
            return plain_sample(job.kernel, job.denoise, job.latents, job.generator, self.stats)
        cls = AutospecSampler if isinstance(self.config, AutospecConfig) else SpeculativeSampler
        if getattr(self.config, "draft", None) in FORECAST_DRAFTS:
            cls = ForecastDraftSampler
        sampler = cls(job.kernel, job.denoise, self.config, self.stats)  # type: ignore[arg-type]

        def on_progress(k: int) -> None:
            bar.update(k - bar.n)
            if job.on_round is not None and k > 0:
                replaced = job.on_round(k - 1, sampler.state)
                if replaced is not None:
                    sampler.state.copy_(replaced)

        return sampler.sample(job.latents, job.generator, on_progress=on_progress)

    def plain(self, *args: Any, **kwargs: Any) -> Any:
        """The plain stochastic sampler (one transformer call per step) that ``coupling`` is exact against."""
        self.stats.reset()
        out = self._generate(args, kwargs, plain=True)
        try:
            out.spec_stats = self.stats
        except AttributeError:  # return_dict=False
            pass
        return out
