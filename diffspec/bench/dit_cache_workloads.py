"""The ``dit-cache`` suite's workloads: a trained ``DiTPipeline`` (quality is real) and a random-weight
transformer of a named architecture in a plain Euler loop (speed at real size)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..api import SpeculativePipeline
from ..config import MethodConfig, SpecaConfig
from ..forecast.controlnet import ControlNetForecast
from ..forecast.hooks import ForecastHooks
from ..metrics import psnr, ssim
from ..stats import SpecStats
from ..testing.random_transformers import (
    AUDIO_FAMILIES,
    SIGMA_FAMILIES,
    SPECS,
    build_flux_controlnet,
    build_transformer,
    make_call,
    timesteps_for,
)
from .timing import Arm
from .workload import Workload

DEFAULT_PROMPTS = (
    "a red fox standing in fresh snow, morning light", "a bowl of ramen on a wooden table, steam rising",
    "an old lighthouse on a cliff during a storm", "a portrait of an astronaut with a reflective visor",
    "a street market in Marrakech at dusk, lanterns", "a watercolor painting of a mountain lake",
    "a macro photo of a dragonfly on a leaf", "a futuristic city skyline with flying trains",
)
"""Prompts a text-conditioned pipeline workload cycles through, seed by seed (``prompts`` overrides them)."""


class PipelineWorkload(Workload):
    """A diffusers pipeline folder (shipped ``tiny-dit`` or local), outputs in [0, 1].

    Class-conditional pipelines (``DiTPipeline``) draw class ``seed % classes`` and are scored against the shipped
    shape classifier (reference FID, accuracy); text-conditioned ones (FLUX, SD3, Wan...) take ``prompts[seed %
    len(prompts)]`` and ``call_kwargs`` (``height``, ``width``, ``num_frames``) and are scored by PSNR/SSIM against
    the full run only (video frames count as images).
    """

    mode = "pipeline"

    def __init__(self, model: str, *, device: torch.device, dtype: torch.dtype, steps: int, batch: int,
                 guidance_scale: float, prompts: list[str] | None = None,
                 call_kwargs: dict[str, Any] | None = None) -> None:
        from ..models import load_pipeline
        from ..models.dit import call_defaults, model_settings

        self.name = model
        self.pipe = load_pipeline(model, dtype=dtype, device=device)
        self.judge = model_settings(self.pipe).get("judge")  # "prompted-scenes": scored by the scene judge
        self.class_conditional = hasattr(self.pipe, "get_label_ids")
        if getattr(self.pipe, "transformer", None) is None:
            raise ValueError(f"dit-cache pipeline workload needs a transformer pipeline; {model!r} is a "
                             f"{type(self.pipe).__name__} without a `transformer`")
        if self.class_conditional and (prompts or call_kwargs):
            raise ValueError(f"{type(self.pipe).__name__} is class-conditional: prompts and sizes do not apply")
        self.pipe.set_progress_bar_config(disable=True)
        self.transformer = self.pipe.transformer
        self.device, self.dtype, self.steps, self.batch = device, dtype, steps, batch
        self.guidance_scale = guidance_scale
        self.num_classes = len(self.pipe.labels) if getattr(self.pipe, "labels", None) else 1000
        self.prompts = list(prompts or (judged_prompts(JUDGED_PROMPTS) if self.judge else DEFAULT_PROMPTS))
        self.call_kwargs = {**call_defaults(self.pipe), **(call_kwargs or {})}
        self.seeds = list(range(batch))

    def labels_for(self, seeds: list[int]) -> list[int]:
        return [s % self.num_classes for s in seeds]

    def generate(self, seeds: list[int], steps: int | None = None, pipe: Any = None) -> torch.Tensor:
        generators = [torch.Generator(self.device).manual_seed(s) for s in seeds]
        condition = ({"class_labels": self.labels_for(seeds)} if self.class_conditional
                     else {"prompt": [self.prompts[s % len(self.prompts)] for s in seeds], **self.call_kwargs})
        out = (pipe or self.pipe)(generator=generators, num_inference_steps=steps or self.steps,
                                  guidance_scale=self.guidance_scale, output_type="pt", **condition)
        frames = getattr(out, "frames", None)
        return (out.images if frames is None else frames).float().cpu()

    def method_arm(self, method: str, config: MethodConfig) -> Arm:
        spec = SpeculativePipeline.from_pipe(self.pipe, method=config)
        spec.disable()
        described = spec.config.to_dict()
        if spec.threshold_source is not None:  # speca: where its thresholds came from
            described["thresholds_from"] = _relative(spec.threshold_source)
        arm = Arm(method, lambda seeds: self.generate(seeds, pipe=spec), enable=spec.enable, disable=spec.disable,
                  config=described)
        arm.spec = spec  # type: ignore[attr-defined]
        return arm

    def quality(self, images: torch.Tensor, reference: torch.Tensor, seeds: list[int]) -> dict[str, Any]:
        if self.judge:
            return prompted_quality(images, reference, [self.prompts[s % len(self.prompts)] for s in seeds])
        if not self.class_conditional:  # no classifier for this model: agreement with the full run only
            flat = images.flatten(0, images.ndim - 4) if images.ndim > 4 else images  # video frames as images
            ref = reference.flatten(0, reference.ndim - 4) if reference.ndim > 4 else reference
            return {"psnr": psnr(images, reference, data_range=1.0), "ssim": ssim(flat, ref), "lpips": None,
                    "fid": None, "accuracy": None}
        from ..models import class_accuracy, paired_accuracy, reference_fid

        labels = torch.tensor(self.labels_for(seeds))
        return {"psnr": psnr(images, reference, data_range=1.0), "ssim": ssim(images, reference),
                "lpips": None, "fid": round(reference_fid(images * 2 - 1), 3),
                "accuracy": round(class_accuracy(images * 2 - 1, labels), 4),
                **paired_accuracy(images * 2 - 1, reference * 2 - 1, labels)}

    def describe(self) -> dict[str, Any]:
        described = {"steps": self.steps, "batch": self.batch, "seeds": self.seeds,
                     "guidance_scale": self.guidance_scale, "scheduler": type(self.pipe.scheduler).__name__,
                     "pipeline": type(self.pipe).__name__}
        if self.class_conditional:
            vae_scale = 2 ** (len(self.pipe.vae.config.block_out_channels) - 1)  # DiTPipeline has no vae_scale_factor
            size = self.pipe.transformer.config.sample_size * vae_scale
            return {**described, "resolution": [size, size]}
        height, width = self.call_kwargs.get("height"), self.call_kwargs.get("width")
        return {**described, "resolution": [height, width] if height and width else None,
                "num_frames": self.call_kwargs.get("num_frames"), "prompts": self.prompts[:10] if self.judge else
                self.prompts, **({"prompt_source": f"render_prompted_scenes({len(self.prompts)}, seed="
                                                   f"{JUDGED_PROMPT_SEED}), prompt seed % {len(self.prompts)}",
                                  "judge": self.judge, "call_kwargs": self.call_kwargs} if self.judge else {})}


JUDGED_PROMPT_SEED = 10**7
"""Seed of the prompted scenes whose prompts a judged model is benchmarked on (apart from training data)."""
JUDGED_PROMPTS = 1000
"""Distinct prompts of a judged model's workload (seed ``s`` takes prompt ``s % 1000``)."""


def judged_prompts(n: int) -> list[str]:
    """``n`` held-out prompts of :func:`~diffspec.data.render_prompted_scenes` (``tiny-flux``'s workload)."""
    from ..data import render_prompted_scenes

    return render_prompted_scenes(max(n, 1), seed=JUDGED_PROMPT_SEED)[1]


def prompted_quality(images: torch.Tensor, reference: torch.Tensor, prompts: list[str]) -> dict[str, Any]:
    """PSNR/SSIM against the full run, the scene judge's prompt accuracy (``accuracy``) and reference FID, and the
    paired change of prompt accuracy against the full run (same seeds) with its standard error."""
    from ..models.scene_judge import prompt_correct, scene_fid

    ok, ref_ok = prompt_correct(images * 2 - 1, prompts)["prompt"], prompt_correct(reference * 2 - 1, prompts)["prompt"]
    diff = ok.double() - ref_ok.double()
    se = float(diff.std() / len(diff) ** 0.5) if len(diff) > 1 else float("nan")
    return {"psnr": psnr(images, reference, data_range=1.0), "ssim": ssim(images, reference), "lpips": None,
            "fid": round(scene_fid(images * 2 - 1), 3) if len(images) > 1 else None,
            "accuracy": round(float(ok.double().mean()), 4), "accuracy_delta": round(float(diff.mean()), 4),
            "accuracy_delta_se": round(se, 4)}


CONTROLNET_WORKLOADS: dict[str, tuple[str, int, int]] = {
    "tiny-flux-controlnet": ("tiny-flux-random", 1, 2),
    "flux-1024-controlnet": ("flux-1024", 5, 10),  # the depth of InstantX's FLUX.1-dev Union ControlNet
}
"""Loop workloads with a random-weight ``FluxControlNetModel`` called before the transformer at every step, as
``FluxControlNetPipeline`` calls it: name -> (transformer spec, ControlNet double blocks, single blocks)."""


def _flux_controlnet(transformer: nn.Module, layers: tuple[int, int], latents: torch.Tensor
                     ) -> tuple[nn.Module, Callable[[Any], Callable[..., Any]]]:
    """A ControlNet shaped for ``transformer`` (:func:`~diffspec.testing.random_transformers.build_flux_controlnet`), with the packed control
    latents it reads, and a wrapper making a transformer call run it first."""
    controlnet = build_flux_controlnet(transformer, *layers, seed=1).to(device=latents.device, dtype=latents.dtype)
    cond = torch.randn(latents.shape, generator=torch.Generator().manual_seed(2)).to(latents.device, latents.dtype)
    names = ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids",
             "guidance")

    def with_controlnet(model: Any) -> Callable[..., Any]:
        def call(**kwargs: Any) -> Any:
            blocks, singles = controlnet(controlnet_cond=cond, conditioning_scale=1.0, return_dict=False,
                                         **{n: kwargs[n] for n in names if n in kwargs})
            return model(controlnet_block_samples=blocks, controlnet_single_block_samples=singles, **kwargs)
        return call

    return controlnet, with_controlnet


class LoopWorkload(Workload):
    """A random-weight transformer of a named architecture in a plain Euler loop (speed at real size).

    ``controlnet``: (double, single) blocks of a FLUX ControlNet run before the transformer at every step
    (:data:`CONTROLNET_WORKLOADS`); ``taylor`` and ``speca`` arms forecast its outputs where the transformer surely
    drafts (:mod:`diffspec.forecast.controlnet`), peers run it every step as their pipelines would.
    """

    mode = "loop"

    def __init__(self, model: str, *, device: torch.device, dtype: torch.dtype, steps: int, batch: int,
                 controlnet: tuple[int, int] | None = None, name: str | None = None) -> None:
        self.name = name or model
        self.spec = SPECS[model]
        self.transformer = build_transformer(model, dtype=dtype, device=device)
        self.latents, self.call = make_call(model, batch, dtype=dtype, device=device)
        self.controlnet: nn.Module | None = None
        if controlnet is not None:
            self.controlnet, with_controlnet = _flux_controlnet(self.transformer, controlnet, self.latents)
            base = self.call
            self.call = lambda transformer, x, t: base(with_controlnet(transformer), x, t)
        self.device, self.dtype, self.steps, self.batch = device, dtype, steps, batch
        self.seeds = [0]
        # Euler steps of d(sigma): timesteps in sigma units step as they are, the others are 1000 * sigma
        self.scale = 1.0 if self.spec.family in SIGMA_FAMILIES else 1000.0

    def generate(self, seeds: list[int], steps: int | None = None) -> torch.Tensor:
        ts = timesteps_for(self.spec.name, steps or self.steps, self.device)
        ends = torch.cat([ts[1:], ts.new_zeros(1)])
        x = self.latents.clone()
        for t, t_next in zip(ts, ends):
            x = x + (t_next - t).to(x.dtype) / self.scale * self.call(self.transformer, x, t)
        return x.float().cpu()

    def quality_seeds(self, n: int) -> list[int]:
        return self.seeds

    def method_arm(self, method: str, config: MethodConfig, forecast_controlnet: bool = True) -> Arm:
        """``forecast_controlnet=False``: the ControlNet (if any) runs in full at every step."""
        stats = SpecStats(method=method)
        if isinstance(config, SpecaConfig) and not config.calibrated:  # random weights: no calibration file
            config = config.with_fallback()
        hooks = ForecastHooks(self.transformer, config, stats, num_steps_fn=lambda: self.steps)
        attached: list[ForecastHooks | ControlNetForecast] = [hooks]
        if self.controlnet is not None and forecast_controlnet:
            plan = None if ControlNetForecast.applies(config) else hooks.certain_draft
            attached.append(ControlNetForecast(self.controlnet, config, stats, num_steps_fn=lambda: self.steps,
                                               plan=plan))

        def run(seeds: list[int]) -> torch.Tensor:
            for hooks in attached:
                hooks.reset()
            stats.reset()
            return self.generate(seeds)

        def enable() -> None:
            for hooks in attached:
                hooks.attach()

        def disable() -> None:
            for hooks in attached:
                hooks.detach()

        described = config.to_dict()
        if self.controlnet is not None:
            described["controlnet"] = "forecast" if len(attached) > 1 else "every step"
        arm = Arm(method, run, enable=enable, disable=disable, config=described)
        arm.stats_obj = stats  # type: ignore[attr-defined]
        return arm

    def describe(self) -> dict[str, Any]:
        hw = self.spec.latent_hw
        px = hw * (16 if self.spec.family == "flux" else 8)
        audio = self.spec.family in AUDIO_FAMILIES
        described = {"steps": self.steps, "batch": self.batch, "resolution": None if audio else [px, px],
                     "seeds": self.seeds, "latent_hw": None if audio else hw, "latent_shape": list(self.latents.shape),
                     "text_tokens": self.spec.text_tokens, "guidance_scale": None,
                     "scheduler": "euler (uniform timesteps)"}
        if self.controlnet is not None:
            described["controlnet"] = {"class": type(self.controlnet).__name__,
                                       "double_blocks": len(self.controlnet.transformer_blocks),
                                       "single_blocks": len(self.controlnet.single_transformer_blocks),
                                       "params": sum(p.numel() for p in self.controlnet.parameters())}
        return described


def _relative(path: str) -> str:
    """Paths inside the repository are reported relative to it (the JSON must not name this machine)."""
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def loop_base(model: str) -> str | None:
    """The transformer spec a loop workload of this name runs (None: a pipeline workload's name or folder)."""
    if model in SPECS:
        return model
    return CONTROLNET_WORKLOADS[model][0] if model in CONTROLNET_WORKLOADS else None


def make_workload(model: str, *, device: torch.device, dtype: torch.dtype, steps: int, batch: int,
                  guidance_scale: float, prompts: list[str] | None = None,
                  call_kwargs: dict[str, Any] | None = None) -> Workload:
    """Pipeline workload for shipped names and local folders (``prompts`` and ``call_kwargs`` for text-conditioned
    ones), loop workload for architecture names."""
    if model in SPECS:
        return LoopWorkload(model, device=device, dtype=dtype, steps=steps, batch=batch)
    if model in CONTROLNET_WORKLOADS:
        base, double, single = CONTROLNET_WORKLOADS[model]
        return LoopWorkload(base, device=device, dtype=dtype, steps=steps, batch=batch, controlnet=(double, single),
                            name=model)
    return PipelineWorkload(model, device=device, dtype=dtype, steps=steps, batch=batch,
                            guidance_scale=guidance_scale, prompts=prompts, call_kwargs=call_kwargs)
