"""`coupling` and `autospec` keep the law of the user's own pipeline across schedule settings: DDPM with
``"trailing"`` and ``"leading"`` timestep spacing, v-prediction and epsilon (PixArt), DDIM at a
call-time ``eta`` (PixArt), SD3's stochastic flow matching at another shift, and Flux's (its own sigma
schedule and resolution shift ``mu``, packed latents).

The reference arm is the unwrapped pipeline itself (its own loop, its own noise). Each case runs,
in the same test, a planted bias (drafts accepted without reflection) that the same two-sample
test must reject, so every case shows its power.
"""

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, FlowMatchEulerDiscreteScheduler
from test_exact_text_pipelines import PROMPT, build_pixart, build_sd3  # same folder (pytest rootdir import)

import diffspec.schedulers.autospec as autospec
import diffspec.schedulers.speculative as speculative
from diffspec import SpeculativePipeline
from diffspec.bench.twosample import same_law
from diffspec.testing.tiny_pipelines import build_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FAST_N, SLOW_N = 300, 1000


def build_flux(scheduler):
    pipe = build_tiny_pipeline("tiny-flux-random")
    return type(pipe)(**{**pipe.components, "scheduler": scheduler})


CASES = {  # name: (pipeline builder, scheduler, steps, call arguments beyond the common ones, methods)
    "pixart-ddpm-trailing-v-fixed-large": (build_pixart, lambda: DDPMScheduler(
        prediction_type="v_prediction", variance_type="fixed_large", timestep_spacing="trailing"), 16, {},
        ("coupling", "autospec")),
    "pixart-ddpm-trailing-eps": (build_pixart, lambda: DDPMScheduler(timestep_spacing="trailing"), 16, {},
                                 ("coupling", "autospec")),
    "pixart-ddpm-leading-v": (build_pixart, lambda: DDPMScheduler(prediction_type="v_prediction",
                                                                  timestep_spacing="leading"), 16, {},
                              ("coupling", "autospec")),
    "pixart-ddim-call-eta": (build_pixart, lambda: DDIMScheduler(timestep_spacing="trailing", clip_sample=False),
                             32, {"eta": 0.6}, ("coupling",)),
    "sd3-flow-stochastic-shift-1": (build_sd3, lambda: FlowMatchEulerDiscreteScheduler(stochastic_sampling=True,
                                                                                       shift=1.0), 24, {},
                                    ("coupling",)),
    "flux-flow-stochastic-dynamic-shift": (build_flux, lambda: FlowMatchEulerDiscreteScheduler(
        stochastic_sampling=True, use_dynamic_shifting=True), 24, {"height": 16, "width": 16}, ("coupling",)),
}


def _call(pipe, steps, extra, latent_side=4):
    call = {"num_inference_steps": steps, "guidance_scale": 4.0, "output_type": "latent", "max_sequence_length": 8,
            "height": 2 * latent_side, "width": 2 * latent_side, **extra}
    if "PixArt" in type(pipe).__name__:
        call.update(use_resolution_binning=False, clean_caption=False)
    return call


def _samples(run, n, seed, call):
    torch.manual_seed(seed)  # SD3 and Flux step with the global RNG
    return run(PROMPT, num_images_per_prompt=n, generator=torch.Generator().manual_seed(seed), **call).images


def _plant(monkeypatch, method):
    """The planted bias: every draft accepted, never reflected (in the module the method couples in)."""
    module = autospec if method == "autospec" else speculative
    original = module.reflection_coupling

    def keep(draft, noise, draft_mean, target_mean, std, uniform):
        out = original(draft, noise, draft_mean, target_mean, std, uniform)
        return type(out)(torch.ones_like(out.accepted), draft, out.log_ratio, out.delta)

    monkeypatch.setattr(module, "reflection_coupling", keep)


def _check(pipe, reference, call, method, n, monkeypatch):
    """The method's samples pass against the pipeline's; the planted bias fails the same test."""
    spec = SpeculativePipeline.from_pipe(pipe, method=method, lookahead=4)
    report = same_law(reference, _samples(spec, n, 2, call))
    assert 0 < spec.stats.accepted < spec.stats.proposed, (method, spec.stats)  # accepts and reflections
    assert report["passed"], (method, report)
    with monkeypatch.context() as patch:
        _plant(patch, method)
        biased = same_law(reference, _samples(spec, n, 2, call))
    assert not biased["passed"], (method, "planted", biased)


@pytest.mark.parametrize("case", list(CASES))
def test_schedule_settings_keep_the_pipelines_law(case, monkeypatch):
    build, scheduler, steps, extra, methods = CASES[case]
    pipe = build(scheduler=scheduler())
    call = _call(pipe, steps, extra)
    reference = _samples(pipe, FAST_N, 1, call)
    for method in methods:
        _check(pipe, reference, call, method, FAST_N, monkeypatch)
    if "eta" in extra:  # what a dropped call-time eta sampled (DDIM at eta 1) is rejected too
        spec = SpeculativePipeline.from_pipe(pipe, method="coupling")
        dropped = same_law(reference, _samples(spec.plain, FAST_N, 2, {**call, "eta": 1.0}))
        assert not dropped["passed"], dropped


@pytest.mark.slow
def test_trailing_v_prediction_fixed_large_at_30_steps_and_1000_samples(monkeypatch):
    """DDPM v-prediction, fixed_large, trailing, 30 steps, guidance 4, 8x8 latents (where autospec crashed)."""
    build, scheduler, _, extra, methods = CASES["pixart-ddpm-trailing-v-fixed-large"]
    pipe = build(scheduler=scheduler())
    call = _call(pipe, 30, extra, latent_side=8)
    reference = _samples(pipe, SLOW_N, 1, call)
    for method in methods:
        _check(pipe, reference, call, method, SLOW_N, monkeypatch)
