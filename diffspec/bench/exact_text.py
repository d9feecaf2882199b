"""The ``exact-diffusion`` suite's text-to-image workload: a judged ``FluxPipeline`` (``tiny-flux``).

A ``FluxPipeline`` folder whose ``diffspec_model.json`` names the judge ``"prompted-scenes"`` is sampled with
``FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)`` (the stochastic flow sampler ``coupling`` is exact
against) at the folder's ``call_defaults`` (height, width, ``max_sequence_length``) and ``steps`` (28 for
``tiny-flux``). Seed ``s`` draws the held-out prompt ``prompts[s % 1000]``
(:func:`~diffspec.bench.dit_cache_workloads.judged_prompts`). Every call seeds the global RNG with its first seed
as well as its generator (``FluxPipeline``'s own loop steps with the global RNG), the baseline's as every arm's.
Quality: the two-sample tests on the final (packed) latents, reference FID of the decoded images against real
prompted scenes (:func:`~diffspec.models.scene_judge.scene_fid`) and the judge's prompt accuracy
(:func:`~diffspec.models.scene_judge.prompt_correct`). Peers that need a DDPM-trained DiT (``picard``, the
DDIM / DPM-Solver++ ODE solvers) are listed under ``"skipped"``.

Example:
    >>> text = TextWorkload(pipe, "tiny-flux")  # doctest: +SKIP
    >>> latents = text.generate(spec.plain, [0, 1], 28, guidance_scale=4.0)  # doctest: +SKIP
    >>> text.scores(latents, [0, 1])  # {"fid": ..., "accuracy": ...}  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .dit_cache_workloads import JUDGED_PROMPT_SEED, JUDGED_PROMPTS, judged_prompts
from .exact_peers import SOLVERS

TEXT_PIPELINES = ("FluxPipeline",)
"""Text-to-image pipeline classes the suite samples (with a stochastic flow-matching scheduler)."""
TEXT_JUDGES = ("prompted-scenes",)
"""``judge`` values of ``diffspec_model.json`` the suite can score (:mod:`~diffspec.models.scene_judge`)."""
DIT_ONLY_PEERS = ("picard", *SOLVERS)
"""Peers built on a DiT's DDPM schedule and class labels: skipped for a text pipeline."""
SUPPORTED = ("a class-conditional DiTPipeline (tiny-dit, a DiT architecture name such as dit-xl-2-256, or a DiT "
             "folder) or a FluxPipeline folder whose diffspec_model.json names the judge 'prompted-scenes' "
             "(tiny-flux)")
DECODE_CHUNK = 250


class TextWorkload:
    """A judged text-to-image pipeline: its scheduler swapped for the stochastic flow sampler, its prompts and call
    arguments, and the scene judge's scores of its samples.

    Raises:
        ValueError: ``pipe`` is not a :data:`TEXT_PIPELINES` class, or its folder names no :data:`TEXT_JUDGES` judge
            (the message names what the suite supports).
    """

    def __init__(self, pipe: Any, model: str) -> None:
        from diffusers import FlowMatchEulerDiscreteScheduler

        from ..models.dit import call_defaults, model_settings

        name, settings = type(pipe).__name__, model_settings(pipe)
        judge = settings.get("judge")
        if name not in TEXT_PIPELINES or judge not in TEXT_JUDGES:
            what = f"a {name}" + ("" if name not in TEXT_PIPELINES else f" with judge {judge!r} in its diffspec_model"
                                                                          ".json (none scores its samples)")
            raise ValueError(f"exact-diffusion supports {SUPPORTED}; {model!r} is {what}")
        pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, stochastic_sampling=True)
        self.pipe, self.judge = pipe, judge
        self.steps = int(settings.get("steps", 28))
        self.call_kwargs = call_defaults(pipe)
        self.prompts = judged_prompts(JUDGED_PROMPTS)

    @property
    def sampler(self) -> str:
        """How the runs' configs name the plain sampler."""
        return "FlowMatchEuler (stochastic)"

    def prompts_for(self, seeds: list[int]) -> list[str]:
        return [self.prompts[s % len(self.prompts)] for s in seeds]

    def generate(self, run: Callable[..., Any], seeds: list[int], steps: int, guidance_scale: float) -> torch.Tensor:
        """Final packed latents of ``run`` (``spec`` or ``spec.plain``) for ``seeds``: one generator seeded with the
        first seed on the pipeline's device, and the global RNG seeded the same way."""
        torch.manual_seed(seeds[0])  # FluxPipeline's own loop steps with the global RNG: seeded for every arm alike
        g = torch.Generator(self.pipe._execution_device).manual_seed(seeds[0])
        out = run(prompt=self.prompts_for(seeds), num_inference_steps=steps, generator=g,
                  guidance_scale=guidance_scale, output_type="latent", **self.call_kwargs)
        return out.images.float().cpu()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Packed latents -> images in [-1, 1], decoded as ``FluxPipeline`` decodes (unpack, unscale and shift)."""
        pipe, vae = self.pipe, self.pipe.vae
        height = self.call_kwargs.get("height") or pipe.default_sample_size * pipe.vae_scale_factor
        width = self.call_kwargs.get("width") or pipe.default_sample_size * pipe.vae_scale_factor
        images = []
        for i in range(0, len(latents), DECODE_CHUNK):
            z = pipe._unpack_latents(latents[i:i + DECODE_CHUNK].to(vae.device, vae.dtype), height, width,
                                     pipe.vae_scale_factor)
            z = z / vae.config.scaling_factor + vae.config.shift_factor
            images.append(vae.decode(z).sample.float().clamp(-1, 1).cpu())
        return torch.cat(images)

    def scores(self, latents: torch.Tensor, seeds: list[int]) -> dict[str, Any]:
        """``fid`` (the judge's reference FID; ``None`` under 2 samples) and ``accuracy`` (share of images the judge
        finds right in every cell of their prompt)."""
        from ..models.scene_judge import prompt_correct, scene_fid

        images = self.decode(latents)
        correct = prompt_correct(images, self.prompts_for(seeds))["prompt"]
        return {"fid": round(scene_fid(images), 3) if len(images) > 1 else None,
                "accuracy": round(float(correct.double().mean()), 4)}

    def skipped(self, methods: list[str]) -> list[dict[str, str]]:
        """The requested DiT-only peers, each with the reason."""
        reason = ("needs a DDPM-trained DiTPipeline (class labels, the DDPM schedule); not defined for "
                  f"{type(self.pipe).__name__}'s flow matching")
        return [{"method": m, "reason": reason} for m in methods if m in DIT_ONLY_PEERS]

    def describe(self, guidance_scale: float) -> dict[str, Any]:
        """The ``workload`` entries that differ from the DiT form's (scheduler, guidance, prompts, call arguments)."""
        pipe = self.pipe
        embedded = bool(pipe.transformer.config.get("guidance_embeds", False))
        config = pipe.scheduler.config
        return {"pipeline": type(pipe).__name__, "scheduler": type(pipe.scheduler).__name__,
                "scheduler_config": {k: config.get(k) for k in ("stochastic_sampling", "shift", "use_dynamic_shifting")},
                "guidance_scale": guidance_scale if embedded else None,
                "resolution": [self.call_kwargs.get("height"), self.call_kwargs.get("width")],
                "call_kwargs": self.call_kwargs, "judge": self.judge, "prompts": self.prompts[:10],
                "prompt_source": f"render_prompted_scenes({len(self.prompts)}, seed={JUDGED_PROMPT_SEED}), "
                                 f"prompt seed % {len(self.prompts)}"}

    def notes(self) -> list[str]:
        return [
            f"{type(self.pipe).__name__} form: seed s takes prompt s % {len(self.prompts)} of the held-out prompted "
            "scenes; two_sample compares the final packed latents; fid is the scene judge's reference FID and "
            "accuracy its prompt accuracy (every cell right: count, positions, shapes, colours) of the decoded "
            "images. guidance_scale is null when the transformer has no guidance embedding (no CFG rows).",
            "Every call seeds its generator and the global RNG with its first seed (FluxPipeline's own loop draws "
            "its step noise from the global RNG); the exact samplers and spec.plain draw from the generator.",
        ]
