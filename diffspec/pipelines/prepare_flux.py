"""What the exact samplers need from diffusers' ``FluxPipeline``, built with the pipeline's own methods.

As ``FluxPipeline.__call__`` does: ``check_inputs``, ``encode_prompt`` (CLIP pooled + T5 sequence,
``max_sequence_length``; again for the negative prompt under true CFG), ``prepare_latents`` (packed
2x2 latents and their ``latent_image_ids``), the sigma schedule ``linspace(1, 1/N, N)`` with the
resolution shift ``mu = calculate_shift(image_seq_len, ...)`` passed to ``set_timesteps``, the
batched denoiser (:func:`~diffspec.pipelines.denoisers.flux_denoiser`), ``callback_on_step_end``
once per round and the decoder (unpack, ``/ scaling_factor + shift_factor``, VAE,
``image_processor.postprocess``, ``FluxPipelineOutput``). The loop never scales its initial noise
or model input and takes no ``eta``; ``scheduler.step`` draws from the global RNG, the exact
samplers from the call's generator.

Example:
    >>> job = prepare_flux(pipe, bound_args, eta=1.0, device="cpu")  # doctest: +SKIP
    >>> output = job.finish(plain_sample(job.kernel, job.denoise, job.latents, job.generator))  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from ..schedulers.gaussian import GaussianTransition
from .denoisers import flux_denoiser
from .job import Job, pipeline_output, refuse

Embeds = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(prompt_embeds, pooled_prompt_embeds, text_ids)`` as ``FluxPipeline.encode_prompt`` returns them."""


def flow_schedule(scheduler: Any, num_inference_steps: int) -> np.ndarray | None:
    """The sigmas ``FluxPipeline`` passes to ``set_timesteps``: ``linspace(1, 1/N, N)``, or ``None`` (the
    number of steps instead) for a scheduler configured with ``use_flow_sigmas``."""
    if scheduler.config.get("use_flow_sigmas", False):
        return None
    return np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)


def flux_mu(pipe: Any, image_seq_len: int) -> float:
    """The resolution shift ``FluxPipeline`` passes to ``set_timesteps`` (always, as the pipeline does)."""
    config = pipe.scheduler.config
    calculate_shift = sys.modules[type(pipe).__module__].calculate_shift
    return calculate_shift(image_seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                           config.get("base_shift", 0.5), config.get("max_shift", 1.15))


def _encode(pipe: Any, a: dict[str, Any], device: torch.device) -> tuple[Embeds, Embeds | None]:
    """The prompt's embeddings, and the negative prompt's under true CFG (``None`` otherwise)."""
    lora_scale = (a["joint_attention_kwargs"] or {}).get("scale")
    has_neg = a["negative_prompt"] is not None or (a["negative_prompt_embeds"] is not None
                                                   and a["negative_pooled_prompt_embeds"] is not None)
    true_cfg = a["true_cfg_scale"] > 1 and has_neg
    if true_cfg and a["prompt_embeds"] is not None and a["negative_prompt_embeds"] is not None:
        if a["prompt_embeds"].shape != a["negative_prompt_embeds"].shape:
            raise ValueError("`prompt_embeds` and `negative_prompt_embeds` must have the same shape when passed "
                             f"directly, but got: `prompt_embeds` {a['prompt_embeds'].shape} != "
                             f"`negative_prompt_embeds` {a['negative_prompt_embeds'].shape}.")
    common = {"device": device, "num_images_per_prompt": a["num_images_per_prompt"],
              "max_sequence_length": a["max_sequence_length"], "lora_scale": lora_scale}
    embeds = pipe.encode_prompt(prompt=a["prompt"], prompt_2=a["prompt_2"], prompt_embeds=a["prompt_embeds"],
                                pooled_prompt_embeds=a["pooled_prompt_embeds"], **common)
    if not true_cfg:
        return embeds, None
    negative = pipe.encode_prompt(prompt=a["negative_prompt"], prompt_2=a["negative_prompt_2"],
                                  prompt_embeds=a["negative_prompt_embeds"],
                                  pooled_prompt_embeds=a["negative_pooled_prompt_embeds"], **common)
    if negative[0].shape != embeds[0].shape:
        raise ValueError(f"true_cfg_scale={a['true_cfg_scale']}: the negative prompt embeddings "
                         f"{tuple(negative[0].shape)} must have the prompt embeddings' shape {tuple(embeds[0].shape)} "
                         "(one negative prompt per prompt, one max_sequence_length): the exact samplers batch the "
                         "negative rows with the positive ones")
    return embeds, negative


def prepare_flux(pipe: Any, a: dict[str, Any], eta: float, device: torch.device) -> Job:
    """``FluxPipeline``: CLIP + T5 prompt encoding (true CFG with a negative prompt and
    ``true_cfg_scale > 1``: a second set of rows in the same transformer call), packed latents, the
    sigma schedule and dynamic shift, ``callback_on_step_end`` once per round (at the last step all
    images reached; returned ``latents`` replace the committed states)."""
    refuse(a, "sigmas", "ip_adapter_image", "ip_adapter_image_embeds", "negative_ip_adapter_image",
           "negative_ip_adapter_image_embeds")
    height = a["height"] or pipe.default_sample_size * pipe.vae_scale_factor
    width = a["width"] or pipe.default_sample_size * pipe.vae_scale_factor
    callback, tensor_inputs = a["callback_on_step_end"], a["callback_on_step_end_tensor_inputs"]
    names = ("negative_prompt", "negative_prompt_2", "prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds",
             "negative_pooled_prompt_embeds", "max_sequence_length")
    pipe.check_inputs(a["prompt"], a["prompt_2"], height, width, callback_on_step_end_tensor_inputs=tensor_inputs,
                      **{k: a[k] for k in names})
    pipe._guidance_scale, pipe._joint_attention_kwargs = a["guidance_scale"], a["joint_attention_kwargs"] or {}
    pipe._current_timestep, pipe._interrupt = None, False
    (embeds, pooled, text_ids), negative = _encode(pipe, a, device)
    latents, image_ids = pipe.prepare_latents(embeds.shape[0], pipe.transformer.config.in_channels // 4, height,
                                              width, embeds.dtype, device, a["generator"], a["latents"])
    steps = a["num_inference_steps"]
    sigmas, mu = flow_schedule(pipe.scheduler, steps), flux_mu(pipe, latents.shape[1])
    kernel = GaussianTransition(pipe.scheduler, steps, eta=eta, device=device, mu=mu, sigmas=sigmas)
    retrieve_timesteps = sys.modules[type(pipe).__module__].retrieve_timesteps
    pipe._num_timesteps = len(retrieve_timesteps(pipe.scheduler, steps, device, sigmas=sigmas, mu=mu)[0])
    pipe.scheduler.set_begin_index(0)
    denoise = flux_denoiser(pipe, kernel.timesteps, (embeds, pooled), None if negative is None else negative[:2],
                            a["true_cfg_scale"], a["guidance_scale"], (text_ids, image_ids), pipe._joint_attention_kwargs)
    on_round = None
    if callback is not None:
        def on_round(step: int, latents: torch.Tensor) -> torch.Tensor | None:
            kwargs = {k: latents if k == "latents" else embeds for k in tensor_inputs}  # latents, prompt_embeds
            return (callback(pipe, step, kernel.timesteps[step], kwargs) or {}).get("latents")

    return Job(kernel, denoise, latents, a["generator"], lambda z: _finish(pipe, a, z, height, width), on_round)


def _finish(pipe: Any, a: dict[str, Any], latents: torch.Tensor, height: int, width: int) -> Any:
    """Decode as ``FluxPipeline`` does: unpack, unscale and shift, VAE, postprocess (packed latents for
    ``output_type="latent"``)."""
    from diffusers.pipelines.flux.pipeline_output import FluxPipelineOutput
    from diffusers.utils.torch_utils import get_module_execution_device

    image: Any = latents
    if a["output_type"] != "latent":
        latents = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor)
        latents = latents / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        image = pipe.vae.decode(latents.to(get_module_execution_device(pipe.vae)), return_dict=False)[0]
        image = pipe.image_processor.postprocess(image, output_type=a["output_type"])
    return pipeline_output(pipe, image, a["return_dict"], FluxPipelineOutput)
