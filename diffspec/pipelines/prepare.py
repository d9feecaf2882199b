"""What the exact samplers need from each supported diffusers pipeline, built with the pipeline's own methods.

For one call's arguments (bound to the pipeline's ``__call__`` signature, its defaults applied),
a preparer checks the inputs and encodes the prompt with the pipeline's ``check_inputs`` /
``encode_prompt``, draws the initial latents with its ``prepare_latents``, builds the scheduler's
:class:`~diffspec.schedulers.gaussian.GaussianTransition` (with SD3's resolution shift ``mu``),
the batched guided denoiser (:mod:`~diffspec.pipelines.denoisers`), the callback adapter and
the decoder that returns the pipeline's own output class. :data:`LOOPS` records how each
pipeline's own loop drives its scheduler; :func:`check_pair` refuses the schedulers that loop does
not run as their own sampler, so the plain path always equals the unwrapped pipeline. ``FluxPipeline``'s
preparer is in :mod:`~diffspec.pipelines.prepare_flux`; the shared :class:`~diffspec.pipelines.job.Job`
in :mod:`~diffspec.pipelines.job`.

Example:
    >>> job = PREPARERS["PixArtAlphaPipeline"](pipe, bound_args, eta=1.0, device="cpu")  # doctest: +SKIP
    >>> output = job.finish(plain_sample(job.kernel, job.denoise, job.latents, job.generator))  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..config import check_float
from ..schedulers.gaussian import GaussianTransition
from .denoisers import dit_denoiser, pixart_denoiser, sd3_denoiser
from .job import Job, pipeline_output, refuse
from .prepare_flux import flow_schedule, prepare_flux


def bind_call(pipe: Any, args: tuple[Any, ...], kwargs: dict[str, Any], defaults: bool = True) -> dict[str, Any]:
    """The call's arguments by name, with the pipeline's ``__call__`` defaults unless ``defaults=False``
    (a ``TypeError`` as the pipeline would raise for unknown ones)."""
    bound = inspect.signature(pipe.__call__).bind(*args, **kwargs)
    if defaults:
        bound.apply_defaults()
    return dict(bound.arguments)


@dataclass(frozen=True)
class Loop:
    """How a pipeline's own denoising loop drives its scheduler: what the plain sampler mirrors.

    Attributes:
        scales_noise: the initial noise is multiplied by ``scheduler.init_noise_sigma``.
        scale_input: ``"input"``: ``scheduler.scale_model_input`` scales the transformer's input only;
            ``"state"``: the scaled sample is also what ``scheduler.step`` advances; ``"none"``: not called.
        takes_eta: the call takes ``eta`` and passes it to ``scheduler.step``.
        passes_sigmas: ``set_timesteps`` gets the pipeline's own sigma schedule and a shift ``mu``
            (:func:`~diffspec.pipelines.prepare_flux.flow_schedule`) instead of the number of steps.
    """

    scales_noise: bool
    scale_input: str
    takes_eta: bool
    passes_sigmas: bool = False


LOOPS = {
    "DiTPipeline": Loop(scales_noise=False, scale_input="state", takes_eta=False),
    "PixArtAlphaPipeline": Loop(scales_noise=True, scale_input="input", takes_eta=True),
    "PixArtSigmaPipeline": Loop(scales_noise=True, scale_input="input", takes_eta=True),
    "StableDiffusion3Pipeline": Loop(scales_noise=False, scale_input="none", takes_eta=False),
    "FluxPipeline": Loop(scales_noise=False, scale_input="none", takes_eta=False, passes_sigmas=True),
}
"""The loop of each supported pipeline (diffusers 0.42)."""


def check_pair(pipe: Any, kernel: GaussianTransition) -> None:
    """Refuse a scheduler that the pipeline's own loop does not run as that scheduler's sampler.

    The plain path is the pipeline's sampler, so a pair whose loop cannot run the scheduler, or runs
    it as another chain (a sigma-scaled scheduler without the noise or input scaling it needs, DDIM
    without a way to pass ``eta > 0``), has no law to be exact against.

    Raises:
        ValueError: naming the pipeline, the scheduler and the reason.
    """
    name, sname = type(pipe).__name__, type(pipe.scheduler).__name__
    loop = LOOPS[name]
    if loop.passes_sigmas:
        _check_schedule(pipe, name, sname)
    fix = "use DDPMScheduler or DPMSolverMultistepScheduler(algorithm_type='sde-dpmsolver++')"
    for attr, read in (("init_noise_sigma", loop.scales_noise), ("scale_model_input", loop.scale_input != "none")):
        if read and not hasattr(pipe.scheduler, attr):
            raise ValueError(f"{sname} lacks {attr}, which {name} reads: the pipeline itself cannot run this "
                             f"scheduler, so there is no sampler to be exact against; {fix}")
    if hasattr(kernel, "in_scale") or float(getattr(pipe.scheduler, "init_noise_sigma", 1.0)) != 1.0:
        gaps = ([] if loop.scales_noise else ["does not multiply its initial noise by init_noise_sigma"]) + (
            ["steps the scale_model_input output instead of the state"] if loop.scale_input == "state" else
            ["never calls scale_model_input"] if loop.scale_input == "none" else [])
        if gaps:
            raise ValueError(f"{name} {' and '.join(gaps)}, so with {sname} it does not sample {sname}'s chain and "
                             f"exact sampling refuses the pair (it would sample another law); {fix}")
    if sname == "DDIMScheduler" and not loop.takes_eta:
        raise ValueError(f"{name} calls DDIMScheduler.step without eta (eta=0: deterministic DDIM) and its call "
                         "takes none, so there is no stochastic sampler to be exact against; use DDPMScheduler "
                         "(DDIM at eta=1) or DPMSolverMultistepScheduler(algorithm_type='sde-dpmsolver++')")


def _check_schedule(pipe: Any, name: str, sname: str) -> None:
    """Refuse a scheduler whose ``set_timesteps`` fails when called as the pipeline calls it (a copy is set)."""
    scheduler = copy.deepcopy(pipe.scheduler)
    sigmas = flow_schedule(scheduler, 2)
    fix = ("use FlowMatchEulerDiscreteScheduler(stochastic_sampling=True) or DPMSolverMultistepScheduler("
           "algorithm_type='sde-dpmsolver++', use_flow_sigmas=True, prediction_type='flow_prediction', "
           "use_dynamic_shifting=True)")
    if sigmas is not None and "sigmas" not in inspect.signature(scheduler.set_timesteps).parameters:
        raise ValueError(f"{name} passes its own sigma schedule to set_timesteps(sigmas=...), which {sname} does "
                         f"not take: the pipeline itself cannot run this scheduler, so there is no sampler to be "
                         f"exact against; {fix}")
    try:
        scheduler.set_timesteps(**({"num_inference_steps": 2} if sigmas is None else {"sigmas": sigmas}),
                                device="cpu", mu=1.0)
    except Exception as err:  # noqa: BLE001 - whatever the pipeline's own call would raise
        error = f"{type(err).__name__}{f': {err}' if str(err) else ''}"
        raise ValueError(f"{name} calls {sname}.set_timesteps with its own sigma schedule and shift mu, which "
                         f"raises {error}; the pipeline itself cannot run this scheduler, so there is no sampler to "
                         f"be exact against; {fix}") from err


def sampler_eta(pipe: Any, passed: dict[str, Any], config_eta: float | None) -> float:
    """DDIM's ``eta`` for one call: the call's ``eta`` (``passed``: the arguments given, no defaults), as the
    pipeline passes it to ``scheduler.step``, else ``config_eta`` (``CouplingConfig.eta``); 1.0 (unused)
    for other schedulers, which ignore ``eta`` as the pipeline's own step does.

    Raises:
        ValueError: the call and the config disagree; DDIM at the pipeline's default ``eta=0``
            (deterministic) or outside ``(0, 1]``.
    """
    if type(pipe.scheduler).__name__ != "DDIMScheduler":
        return 1.0
    call = passed.get("eta")
    if call is not None and config_eta is not None and call != config_eta:
        raise ValueError(f"eta={call} in the call and CouplingConfig(eta={config_eta}) disagree; set one of them")
    eta = call if call is not None else config_eta
    if eta is None:
        default = inspect.signature(pipe.__call__).parameters["eta"].default
        raise ValueError(f"{type(pipe).__name__} samples DDIMScheduler at eta={default} (its default), which is "
                         "deterministic; exact sampling needs eta in (0, 1]: pass eta= to the call (as to the "
                         "pipeline) or CouplingConfig(eta=...)")
    check_float("eta", eta, 0.0, 1.0, lo_open=True)
    return float(eta)


def prepare_dit(pipe: Any, a: dict[str, Any], eta: float, device: torch.device) -> Job:
    """``DiTPipeline(class_labels, guidance_scale, generator, num_inference_steps, output_type, return_dict)``."""
    from diffusers.pipelines.pipeline_utils import ImagePipelineOutput
    from diffusers.utils.torch_utils import randn_tensor

    kernel = GaussianTransition(pipe.scheduler, a["num_inference_steps"], eta=eta, device=device)
    labels = torch.as_tensor(a["class_labels"], device=device).reshape(-1)
    config = pipe.transformer.config
    shape = (len(labels), config.in_channels, config.sample_size, config.sample_size)
    latents = randn_tensor(shape, generator=a["generator"], device=device, dtype=torch.float32)  # not scaled, as DiT
    denoise = dit_denoiser(pipe, labels, a["guidance_scale"], kernel.timesteps)

    def finish(latents: torch.Tensor) -> Any:
        images: Any = latents
        if a["output_type"] != "latent":
            images = pipe.vae.decode(latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor).sample
            images = (images / 2 + 0.5).clamp(0, 1)
            if a["output_type"] != "pt":
                images = images.cpu().permute(0, 2, 3, 1).float().numpy()
                if a["output_type"] == "pil":
                    images = pipe.numpy_to_pil(images)
        return pipeline_output(pipe, images, a["return_dict"], ImagePipelineOutput)

    return Job(kernel, denoise, latents, a["generator"], finish)


PIXART_BINS = {256: "ASPECT_RATIO_2048_BIN", 128: "ASPECT_RATIO_1024_BIN", 64: "ASPECT_RATIO_512_BIN",
               32: "ASPECT_RATIO_256_BIN"}
"""Transformer sample size -> the aspect-ratio bins the PixArt pipeline module defines for it."""


def prepare_pixart(pipe: Any, a: dict[str, Any], eta: float, device: torch.device) -> Job:
    """``PixArtAlphaPipeline`` / ``PixArtSigmaPipeline``: resolution binning, T5 prompt encoding, latents,
    Alpha's resolution / aspect-ratio micro-conditions at sample size 128, old-style
    ``callback(step, t, latents)`` (called once per round, at the last step all images reached)."""
    from diffusers.pipelines.pipeline_utils import ImagePipelineOutput

    refuse(a, "timesteps", "sigmas")
    if a["num_inference_steps"] == 1:
        raise ValueError("num_inference_steps=1: PixArt pipelines return the predicted clean sample of their one "
                         "step (no noise), so there is nothing stochastic to sample exactly; use 2 or more steps")
    sample_size = pipe.transformer.config.sample_size
    height = a["height"] or sample_size * pipe.vae_scale_factor
    width = a["width"] or sample_size * pipe.vae_scale_factor
    orig = (height, width)
    if a["use_resolution_binning"]:
        bins = getattr(sys.modules[type(pipe).__module__], PIXART_BINS.get(sample_size, ""), None)
        if bins is None:
            raise ValueError(f"Invalid sample size {sample_size} for resolution binning; pass use_resolution_binning=False")
        height, width = pipe.image_processor.classify_height_width_bin(height, width, ratios=bins)
    pipe.check_inputs(a["prompt"], height, width, a["negative_prompt"], a["callback_steps"], a["prompt_embeds"],
                      a["negative_prompt_embeds"], a["prompt_attention_mask"], a["negative_prompt_attention_mask"])
    guidance = a["guidance_scale"]
    embeds, mask, neg_embeds, neg_mask = pipe.encode_prompt(
        a["prompt"], guidance > 1.0, negative_prompt=a["negative_prompt"],
        num_images_per_prompt=a["num_images_per_prompt"], device=device, prompt_embeds=a["prompt_embeds"],
        negative_prompt_embeds=a["negative_prompt_embeds"], prompt_attention_mask=a["prompt_attention_mask"],
        negative_prompt_attention_mask=a["negative_prompt_attention_mask"], clean_caption=a["clean_caption"],
        max_sequence_length=a["max_sequence_length"])
    steps = a["num_inference_steps"]
    kernel = GaussianTransition(pipe.scheduler, steps, eta=eta, device=device)
    pipe.scheduler.set_timesteps(steps, device=device)  # prepare_latents reads its init_noise_sigma
    batch = embeds.shape[0]
    latents = pipe.prepare_latents(batch, pipe.transformer.config.in_channels, height, width, embeds.dtype, device,
                                   a["generator"], a["latents"])
    micro = None
    if type(pipe).__name__ == "PixArtAlphaPipeline" and sample_size == 128:
        micro = {"resolution": torch.tensor([height, width]).repeat(batch, 1).to(embeds.dtype).to(device),
                 "aspect_ratio": torch.tensor([float(height / width)]).repeat(batch, 1).to(embeds.dtype).to(device)}
    negative = (neg_embeds, neg_mask) if guidance > 1.0 else None
    denoise = pixart_denoiser(pipe, kernel.timesteps, (embeds, mask), negative, guidance, micro)

    def finish(latents: torch.Tensor) -> Any:
        image: Any = latents
        if a["output_type"] != "latent":
            image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
            if a["use_resolution_binning"]:
                image = pipe.image_processor.resize_and_crop_tensor(image, orig[1], orig[0])
            image = pipe.image_processor.postprocess(image, output_type=a["output_type"])
        return pipeline_output(pipe, image, a["return_dict"], ImagePipelineOutput)

    on_round = None
    if a["callback"] is not None:
        def on_round(step: int, latents: torch.Tensor) -> None:
            a["callback"](step, kernel.timesteps[step], latents)

    return Job(kernel, denoise, latents, a["generator"], finish, on_round)


def _sd3_mu(pipe: Any, a: dict[str, Any], latents: torch.Tensor) -> float | None:
    config = pipe.scheduler.config
    if a.get("mu") is not None or not config.get("use_dynamic_shifting", None):
        return a.get("mu")
    calculate_shift = sys.modules[type(pipe).__module__].calculate_shift
    patch = pipe.transformer.config.patch_size
    seq = (latents.shape[-2] // patch) * (latents.shape[-1] // patch)
    return calculate_shift(seq, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                           config.get("base_shift", 0.5), config.get("max_shift", 1.16))


def prepare_sd3(pipe: Any, a: dict[str, Any], eta: float, device: torch.device) -> Job:
    """``StableDiffusion3Pipeline``: three-encoder prompt encoding with pooled projections, latents,
    the dynamic shift ``mu``, ``callback_on_step_end`` once per round (at the last step all images
    reached; returned ``latents`` replace the committed states)."""
    from diffusers.pipelines.stable_diffusion_3.pipeline_output import StableDiffusion3PipelineOutput

    refuse(a, "sigmas", "skip_guidance_layers", "ip_adapter_image", "ip_adapter_image_embeds")
    height = a["height"] or pipe.default_sample_size * pipe.vae_scale_factor
    width = a["width"] or pipe.default_sample_size * pipe.vae_scale_factor
    callback = a["callback_on_step_end"]
    tensor_inputs = getattr(callback, "tensor_inputs", None) or a["callback_on_step_end_tensor_inputs"]
    names = ("negative_prompt", "negative_prompt_2", "negative_prompt_3", "prompt_embeds", "negative_prompt_embeds",
             "pooled_prompt_embeds", "negative_pooled_prompt_embeds", "max_sequence_length")
    pipe.check_inputs(a["prompt"], a["prompt_2"], a["prompt_3"], height, width,
                      callback_on_step_end_tensor_inputs=tensor_inputs, **{k: a[k] for k in names})
    pipe._guidance_scale, pipe._clip_skip = a["guidance_scale"], a["clip_skip"]
    pipe._joint_attention_kwargs, pipe._interrupt = a["joint_attention_kwargs"], False
    lora_scale = (a["joint_attention_kwargs"] or {}).get("scale")
    embeds, neg_embeds, pooled, neg_pooled = pipe.encode_prompt(
        prompt=a["prompt"], prompt_2=a["prompt_2"], prompt_3=a["prompt_3"],
        do_classifier_free_guidance=pipe.do_classifier_free_guidance, device=device, clip_skip=pipe.clip_skip,
        num_images_per_prompt=a["num_images_per_prompt"], lora_scale=lora_scale,
        **{k: a[k] for k in names})
    latents = pipe.prepare_latents(embeds.shape[0], pipe.transformer.config.in_channels, height, width, embeds.dtype,
                                   device, a["generator"], a["latents"])
    mu = _sd3_mu(pipe, a, latents)
    kernel = GaussianTransition(pipe.scheduler, a["num_inference_steps"], eta=eta, device=device, mu=mu)
    pipe.scheduler.set_timesteps(a["num_inference_steps"], device=device, **({} if mu is None else {"mu": mu}))
    cfg = pipe.do_classifier_free_guidance
    negative = (neg_embeds, neg_pooled) if cfg else None
    denoise = sd3_denoiser(pipe, kernel.timesteps, (embeds, pooled), negative, a["guidance_scale"],
                           a["joint_attention_kwargs"])

    def finish(latents: torch.Tensor) -> Any:
        image: Any = latents
        if a["output_type"] != "latent":
            latents = latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
            image = pipe.vae.decode(latents, return_dict=False)[0]
            image = pipe.image_processor.postprocess(image, output_type=a["output_type"])
        return pipeline_output(pipe, image, a["return_dict"], StableDiffusion3PipelineOutput)

    on_round = None
    if callback is not None:
        values = {"prompt_embeds": torch.cat([neg_embeds, embeds]) if cfg else embeds,
                  "pooled_prompt_embeds": torch.cat([neg_pooled, pooled]) if cfg else pooled}

        def on_round(step: int, latents: torch.Tensor) -> torch.Tensor | None:
            kwargs = {k: latents if k == "latents" else values[k] for k in tensor_inputs}
            return (callback(pipe, step, kernel.timesteps[step], kwargs) or {}).get("latents")

    return Job(kernel, denoise, latents, a["generator"], finish, on_round)


PREPARERS: dict[str, Callable[[Any, dict[str, Any], float, torch.device], Job]] = {
    "DiTPipeline": prepare_dit,
    "PixArtAlphaPipeline": prepare_pixart,
    "PixArtSigmaPipeline": prepare_pixart,
    "StableDiffusion3Pipeline": prepare_sd3,
    "FluxPipeline": prepare_flux,
}
"""Supported pipeline class names and their preparers."""
