"""A call's NaN or infinite arguments are refused before the generation starts, named in the error: a NaN guidance
scale would run as if guidance were off, a NaN in ``latents`` would give an all-NaN output."""

import math

import pytest
import torch
from diffusers import DDPMScheduler

from diffspec import SpeculativePipeline
from diffspec.ar_image.targets.toy import ToyTableTarget
from diffspec.testing.tiny_pipelines import build_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


def _dit(spec, *args, **kwargs):
    return spec(*args, num_inference_steps=4, generator=torch.Generator().manual_seed(0), output_type="np", **kwargs)


@pytest.mark.parametrize("method", ["taylor", "speca", "coupling"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_guidance_scale_is_refused(tiny_dit_pipe, method, value):
    pipe = tiny_dit_pipe
    if method == "coupling":  # exact sampling needs a stochastic scheduler; the shipped one is DDIM at eta=0
        pipe = type(pipe)(**{**pipe.components, "scheduler": DDPMScheduler.from_config(pipe.scheduler.config)})
        pipe.set_progress_bar_config(disable=True)
    spec = SpeculativePipeline.from_pipe(pipe, method=method)
    try:
        with pytest.raises(ValueError, match=rf"^guidance_scale={value!r} is not finite"):
            _dit(spec, class_labels=[1], guidance_scale=value)
        with pytest.raises(ValueError, match=rf"^guidance_scale={value!r} is not finite"):  # passed by position
            _dit(spec, [1], value)
        assert _dit(spec, class_labels=[1], guidance_scale=4.0).images.shape == (1, 16, 16, 3)
    finally:
        spec.disable()


def test_nan_latents_are_refused_naming_them():
    pipe = build_tiny_pipeline("tiny-wan")
    pipe.set_progress_bar_config(disable=True)
    spec = SpeculativePipeline.from_pipe(pipe, method="taylor")
    generator = torch.Generator().manual_seed(0)
    latents = pipe.prepare_latents(1, pipe.transformer.config.in_channels, 32, 32, 5, torch.float32, "cpu", generator)
    latents[0, 0, 0, 0, 0] = math.nan
    call = {"prompt": "a red fox", "num_frames": 5, "height": 32, "width": 32, "num_inference_steps": 3,
            "output_type": "pt"}
    with pytest.raises(ValueError, match=rf"^latents holds 1 non-finite value\(s\) \(NaN or Inf\) among its {latents.numel()}"):
        spec(latents=latents, **call)
    latents[0, 0, 0, 0, 0] = 0.0
    assert torch.isfinite(spec(latents=latents, **call).frames).all()
    spec.disable()


def test_ar_image_sampling_overrides_are_checked():
    spec = SpeculativePipeline.from_pipe(ToyTableTarget(seed=0), method="mc-sjd")
    with pytest.raises(ValueError, match=r"^temperature=nan is not finite"):
        spec(class_labels=[0], temperature=math.nan)
    with pytest.raises(ValueError, match=r"^guidance_scale=inf is not finite"):
        spec([0], None, math.inf)
