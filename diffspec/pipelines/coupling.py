"""The ``coupling`` method on diffusers DiT pipelines: exact speculative sampling, same call as the pipeline.

The wrapper owns the denoising loop (the speculative sampler evaluates several steps per network
call) and reuses the pipeline's components: its transformer, scheduler (read as a pure Gaussian
transition), VAE, class labels and output class.

Example:
    >>> pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)  # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pipe(pipe, method="coupling", lookahead=4)  # doctest: +SKIP
    >>> images = spec(class_labels=[1, 2], num_inference_steps=50).images  # doctest: +SKIP
    >>> spec.stats.target_calls  # fewer sequential transformer calls than 50  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from ..api import SpeculativePipeline
from ..config import AutospecConfig, CouplingConfig, MethodConfig
from ..progress import progress
from ..schedulers.autospec import AutospecSampler
from ..schedulers.forecast_draft import FORECAST_DRAFTS, ForecastDraftSampler
from ..schedulers.gaussian import GaussianTransition
from ..schedulers.speculative import Denoise, SpeculativeSampler, plain_sample

SUPPORTED_PIPELINES = ("DiTPipeline",)


def dit_denoiser(pipe: Any, class_labels: torch.Tensor, guidance_scale: float) -> Denoise:
    """The guided noise prediction of a ``DiTPipeline`` for rows at their own timesteps and classes.

    Rows are doubled for classifier-free guidance (the null class is DiT's 1000, as the pipeline
    uses) and learned-sigma channels dropped, exactly as ``DiTPipeline.__call__`` does per step.
    """
    transformer = pipe.transformer
    channels = transformer.config.in_channels
    null = torch.full_like(class_labels, 1000)
    timesteps: torch.Tensor | None = None

    def denoise(model_input: torch.Tensor, steps: torch.Tensor, traj: torch.Tensor) -> torch.Tensor:
        t = timesteps[steps]  # type: ignore[index]
        labels = class_labels[traj]
        if guidance_scale > 1:
            model_input = torch.cat([model_input, model_input])
            t, labels = torch.cat([t, t]), torch.cat([labels, null[traj]])
        out = transformer(model_input.to(transformer.dtype), timestep=t, class_labels=labels).sample
        eps = out[:, :channels].float()
        if guidance_scale > 1:
            cond, uncond = eps.chunk(2)
            eps = uncond + guidance_scale * (cond - uncond)
        return eps

    def set_timesteps(values: torch.Tensor) -> None:
        nonlocal timesteps
        timesteps = values

    denoise.set_timesteps = set_timesteps  # type: ignore[attr-defined]
    return denoise


class CouplingPipeline(SpeculativePipeline):
    """A ``DiTPipeline`` sampled by exact speculative sampling (``coupling`` or ``autospec``).

    The output law equals the plain stochastic sampler's with the same scheduler, steps and
    guidance (``spec.plain(...)`` runs that sampler). ``DDIMScheduler`` is sampled at the
    config's ``eta`` (> 0); deterministic schedulers are refused.
    """

    family = "diffusion"

    def __init__(self, pipe: Any, config: CouplingConfig | AutospecConfig) -> None:
        super().__init__(pipe, config)
        self.enable()

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig) -> CouplingPipeline:
        name = type(target).__name__
        if name not in SUPPORTED_PIPELINES or not hasattr(target, "transformer"):
            raise ValueError(f"method 'coupling' supports {', '.join(SUPPORTED_PIPELINES)}; got {name} "
                             "(PixArt and SD3-style pipelines are planned)")
        if not isinstance(config, (CouplingConfig, AutospecConfig)):
            raise ValueError(f"{type(config).__name__} is not an exact sampling config")
        kernel = GaussianTransition(target.scheduler, 2, eta=getattr(config, "eta", 1.0))  # refuse ODE samplers
        if isinstance(config, AutospecConfig) and kernel.name != "DDPMScheduler":
            raise ValueError(f"method 'autospec' (ASD) needs DDPMScheduler; the pipeline has {kernel.name}. "
                             "pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config), or method='coupling'")
        return cls(target, config)

    def _run(self, class_labels: Any, guidance_scale: float = 4.0, generator: torch.Generator | None = None,
             num_inference_steps: int = 50, output_type: str = "pil", return_dict: bool = True,
             plain: bool = False) -> Any:
        from diffusers.pipelines.pipeline_utils import ImagePipelineOutput
        from diffusers.utils.torch_utils import randn_tensor

        pipe, device = self.pipe, self.pipe._execution_device
        kernel = GaussianTransition(pipe.scheduler, num_inference_steps, eta=getattr(self.config, "eta", 1.0),
                                    device=device)
        labels = torch.as_tensor(class_labels, device=device).reshape(-1)
        config = pipe.transformer.config
        shape = (len(labels), config.in_channels, config.sample_size, config.sample_size)
        latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        latents = latents * float(kernel.scheduler.init_noise_sigma)
        denoise = dit_denoiser(pipe, labels, guidance_scale)
        denoise.set_timesteps(kernel.timesteps)  # type: ignore[attr-defined]
        disable = getattr(pipe, "_progress_bar_config", {}).get("disable", False)
        with torch.no_grad(), progress(total=num_inference_steps, desc=self.config.method, disable=disable) as bar:
            if plain:
                latents = plain_sample(kernel, denoise, latents, generator, self.stats)
            else:
                cls = AutospecSampler if isinstance(self.config, AutospecConfig) else SpeculativeSampler
                if getattr(self.config, "draft", None) in FORECAST_DRAFTS:
                    cls = ForecastDraftSampler
                sampler = cls(kernel, denoise, self.config, self.stats)  # type: ignore[arg-type]
                latents = sampler.sample(latents, generator, on_progress=lambda k: bar.update(k - bar.n))
            bar.update(num_inference_steps - bar.n)
            self.stats.full_steps = self.stats.target_calls
            if output_type == "latent":
                return ImagePipelineOutput(images=latents) if return_dict else (latents,)
            images = pipe.vae.decode(latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor).sample
        images = (images / 2 + 0.5).clamp(0, 1)
        if output_type != "pt":
            images = images.cpu().permute(0, 2, 3, 1).float().numpy()
            if output_type == "pil":
                images = pipe.numpy_to_pil(images)
        return ImagePipelineOutput(images=images) if return_dict else (images,)

    def plain(self, *args: Any, **kwargs: Any) -> Any:
        """The plain stochastic sampler (one transformer call per step) that ``coupling`` is exact against."""
        self.stats.reset()
        out = self._run(*args, plain=True, **kwargs)
        out.spec_stats = self.stats
        return out
