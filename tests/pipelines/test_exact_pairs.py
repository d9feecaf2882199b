"""`spec.plain` is the user's own pipeline, pair by pair: every pipeline/scheduler pair `coupling` and
`autospec` accept gives the unwrapped pipeline's output for the same noise and call arguments, and every
other pair is refused with the reason.

The unwrapped pipeline draws its step noise from the call's generator: PixArt passes it to
``scheduler.step`` itself; DiT, SD3 and Flux call ``step`` without it (global RNG), so the test hands it
over. DiT also steps both of its identical guidance halves; the test steps the first (the one the
pipeline keeps) and copies it, so both sides draw one noise tensor per step.
"""

from contextlib import contextmanager

import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    DPMSolverSinglestepScheduler,
    EulerAncestralDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxTransformer2DModel,
    LTXEulerAncestralRFScheduler,
    PixArtSigmaPipeline,
)
from test_exact_sampling import build_random_dit  # same folder (pytest rootdir import)
from test_exact_text_pipelines import PROMPT, build_pixart, build_sd3

from diffspec import SpeculativePipeline
from diffspec.testing.tiny_pipelines import build_tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SCHEDULERS = {
    "ddpm": lambda: DDPMScheduler(),
    "ddpm-trailing-v-large": lambda: DDPMScheduler(prediction_type="v_prediction", variance_type="fixed_large",
                                                   timestep_spacing="trailing"),
    "ddim-trailing": lambda: DDIMScheduler(timestep_spacing="trailing"),
    "euler-ancestral": lambda: EulerAncestralDiscreteScheduler(),
    "euler-ancestral-trailing-v": lambda: EulerAncestralDiscreteScheduler(prediction_type="v_prediction",
                                                                          timestep_spacing="trailing"),
    "flow-stochastic": lambda: FlowMatchEulerDiscreteScheduler(stochastic_sampling=True, shift=3.0),
    "ltx-euler-ancestral-rf": lambda: LTXEulerAncestralRFScheduler(),
    "sde-dpm-solver++-2m": lambda: DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=2),
    "sde-dpm-solver-singlestep": lambda: DPMSolverSinglestepScheduler(algorithm_type="sde-dpmsolver++",
                                                                      solver_order=1),
}
DIFFUSION = ("ddpm", "ddpm-trailing-v-large", "sde-dpm-solver++-2m", "sde-dpm-solver-singlestep")
ACCEPTED = {
    "dit": DIFFUSION,
    "pixart-alpha": (*DIFFUSION, "ddim-trailing", "euler-ancestral", "euler-ancestral-trailing-v"),
    "pixart-sigma": (*DIFFUSION, "ddim-trailing", "euler-ancestral", "euler-ancestral-trailing-v"),
    "sd3": (*DIFFUSION, "flow-stochastic", "ltx-euler-ancestral-rf"),
    "flux": ("flow-stochastic",),
}
REFUSED = {  # (pipeline, scheduler): what the error names
    ("dit", "ddim-trailing"): "without eta",
    ("dit", "euler-ancestral"): "init_noise_sigma",
    ("dit", "euler-ancestral-trailing-v"): "init_noise_sigma",
    ("dit", "flow-stochastic"): "lacks scale_model_input",
    ("dit", "ltx-euler-ancestral-rf"): "lacks scale_model_input",
    **{(kind, name): "lacks init_noise_sigma" for kind in ("pixart-alpha", "pixart-sigma")
       for name in ("flow-stochastic", "ltx-euler-ancestral-rf")},
    ("sd3", "ddim-trailing"): "without eta",
    ("sd3", "euler-ancestral"): "init_noise_sigma",
    ("sd3", "euler-ancestral-trailing-v"): "init_noise_sigma",
    **{("flux", name): r"set_timesteps\(sigmas=...\), which \w+ does not take"
       for name in (*DIFFUSION, "ddim-trailing", "euler-ancestral", "euler-ancestral-trailing-v")},
    ("flux", "ltx-euler-ancestral-rf"): "set_timesteps .* raises TypeError",  # FluxPipeline's ndarray sigmas
}
AUTOSPEC = ("DDPMScheduler", "DPMSolverMultistepScheduler")
STEPS = 5


@pytest.fixture(scope="module")
def pipes():
    """One tiny pipeline per kind; a pair swaps its scheduler in (same components)."""
    return {"dit": build_random_dit(), "pixart-alpha": build_pixart(),
            "pixart-sigma": build_pixart(PixArtSigmaPipeline, sample_size=32), "sd3": build_sd3(),
            "flux": build_tiny_pipeline("tiny-flux-random")}


def _with(pipe, scheduler):
    paired = type(pipe)(**{**pipe.components, "scheduler": scheduler})
    paired.set_progress_bar_config(disable=True)
    return paired


def _call(kind, scheduler_name):
    """Same call arguments for both sides (the DDIM pairs pass the call-time eta that makes them stochastic)."""
    if kind == "dit":
        return {"class_labels": [1, 7], "guidance_scale": 4.0, "output_type": "pt"}
    side = 16 if kind == "flux" else 8  # Flux: 2x VAE, 2x2 packing
    text = {"max_sequence_length": 8, "height": side, "width": side, "guidance_scale": 3.0, "output_type": "latent"}
    if kind.startswith("pixart"):
        text.update(use_resolution_binning=False, clean_caption=False)
        if scheduler_name.startswith("ddim"):
            text["eta"] = 0.6
    return {"prompt": [PROMPT, "a blue bird"], **text}


@contextmanager
def step_noise_from(pipe, generator, halves):
    """``pipe.scheduler.step`` draws from ``generator``; with ``halves`` it steps the first half and copies it.

    Only for DiT, SD3 and Flux: PixArt passes its generator (and ``eta``, found by inspecting ``step``) itself.
    """
    step = pipe.scheduler.step

    def seeded(model_output, t, sample, *args, **kwargs):
        kwargs["generator"] = generator
        if not halves:
            return step(model_output, t, sample, *args, **kwargs)
        b = sample.shape[0] // 2
        out = step(model_output[:b], t, sample[:b], *args, **kwargs)
        out.prev_sample = torch.cat([out.prev_sample, out.prev_sample])
        return out

    pipe.scheduler.step = seeded
    try:
        yield
    finally:
        pipe.scheduler.step = step


def _pairs(table):
    return [(kind, name) for kind, names in table.items() for name in names]


def _unwrapped(pipe, kind, call):
    """The pipeline's own output for seed 4, and for DiT (which always decodes) its final latents too."""
    g = torch.Generator().manual_seed(4)
    if kind.startswith("pixart"):
        return torch.as_tensor(pipe(num_inference_steps=STEPS, generator=g, **call).images), None
    seen, decode = [], pipe.vae.decode
    pipe.vae.decode = lambda z, *a, **kw: seen.append(z * pipe.vae.config.scaling_factor) or decode(z, *a, **kw)
    try:
        with step_noise_from(pipe, g, halves=kind == "dit"):
            images = torch.as_tensor(pipe(num_inference_steps=STEPS, generator=g, **call).images)
    finally:
        del pipe.vae.decode
    return images, seen[0] if seen else None


@pytest.mark.parametrize("kind, scheduler_name", _pairs(ACCEPTED), ids=lambda v: v)
def test_plain_equals_the_unwrapped_pipeline(pipes, kind, scheduler_name):
    pipe = _with(pipes[kind], SCHEDULERS[scheduler_name]())
    call = _call(kind, scheduler_name)
    direct, latents = _unwrapped(pipe, kind, call)
    methods = ["coupling"] + (["autospec"] if type(pipe.scheduler).__name__ in AUTOSPEC else [])
    for method in methods:
        spec = SpeculativePipeline.from_pipe(pipe, method=method)
        plain = spec.plain(num_inference_steps=STEPS, generator=torch.Generator().manual_seed(4), **call)
        images = torch.as_tensor(plain.images)
        assert images.shape == direct.shape and torch.isfinite(images).all()
        torch.testing.assert_close(images, direct, atol=1e-5, rtol=1e-5, msg=f"{method} on {kind} + {scheduler_name}")
        assert plain.spec_stats.target_calls == STEPS
        if latents is not None:
            mine = spec.plain(num_inference_steps=STEPS, generator=torch.Generator().manual_seed(4),
                              **{**call, "output_type": "latent"}).images
            torch.testing.assert_close(mine, latents, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind, scheduler_name", list(REFUSED), ids=lambda v: v)
def test_pairs_the_pipeline_does_not_sample_are_refused_with_the_reason(pipes, kind, scheduler_name):
    pipe = _with(pipes[kind], SCHEDULERS[scheduler_name]())
    with pytest.raises(ValueError, match=REFUSED[(kind, scheduler_name)]):
        SpeculativePipeline.from_pipe(pipe, method="coupling")


def test_every_pipeline_scheduler_pair_is_either_tested_equal_or_refused():
    pairs = {(kind, name) for kind in ACCEPTED for name in SCHEDULERS}
    assert set(_pairs(ACCEPTED)) | set(REFUSED) == pairs and not set(_pairs(ACCEPTED)) & set(REFUSED)


def test_euler_ancestral_on_dit_is_refused_since_dit_neither_scales_the_noise_nor_the_state(pipes):
    """diffusers' DiTPipeline does not multiply its initial noise by ``init_noise_sigma`` and steps the
    ``scale_model_input`` output: not the Euler-Ancestral sampler the plain path would run."""
    pipe = _with(pipes["dit"], EulerAncestralDiscreteScheduler())
    for method in ("coupling", "autospec"):
        with pytest.raises(ValueError, match="DiTPipeline .*init_noise_sigma"):
            SpeculativePipeline.from_pipe(pipe, method=method)


def test_a_call_time_eta_is_the_samplers_eta(pipes):
    """``spec.plain(prompt, eta=0.6)`` is ``pipe(prompt, eta=0.6)``, and differs from eta 0.3."""
    pipe = _with(pipes["pixart-alpha"], DDIMScheduler(timestep_spacing="trailing"))
    call = {**_call("pixart-alpha", "ddpm"), "num_inference_steps": STEPS}  # no eta: the tests pass it
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling")
    run = lambda fn, eta: fn(eta=eta, generator=torch.Generator().manual_seed(4), **call).images  # noqa: E731
    torch.testing.assert_close(run(spec.plain, 0.6), run(pipe, 0.6), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(run(spec.plain, 0.6), run(spec.plain, 0.3), atol=1e-2)


def test_a_call_time_eta_is_honoured_or_refused_never_dropped(pipes):
    pipe = _with(pipes["pixart-alpha"], DDIMScheduler(timestep_spacing="trailing"))
    call = {**_call("pixart-alpha", "ddpm"), "num_inference_steps": STEPS}  # no eta: the tests pass it
    with pytest.raises(ValueError, match=r"eta=0\.0 .*deterministic.*eta="):  # the pipeline's default eta
        SpeculativePipeline.from_pipe(pipe, method="coupling")(**call)
    configured = SpeculativePipeline.from_pipe(pipe, method="coupling", eta=0.6)
    torch.testing.assert_close(configured.plain(generator=torch.Generator().manual_seed(4), **call).images,
                               pipe(eta=0.6, generator=torch.Generator().manual_seed(4), **call).images,
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"eta=0\.3 .*CouplingConfig\(eta=0\.6\)"):
        configured(eta=0.3, **call)
    with pytest.raises(ValueError, match=r"eta=1\.5 is out of range"):
        SpeculativePipeline.from_pipe(pipe, method="coupling").plain(eta=1.5, **call)
    with pytest.raises(TypeError):  # DiTPipeline takes no eta: the same TypeError the pipeline raises
        SpeculativePipeline.from_pipe(pipes["dit"], method="coupling")(class_labels=[1], eta=0.5)


FLUX_SCHEDULERS = {  # Flux's own configuration (dynamic shift) and the flow-sigma SDE-DPM-Solver it also runs
    "flow-stochastic-dynamic-shift": lambda: FlowMatchEulerDiscreteScheduler(
        stochastic_sampling=True, use_dynamic_shifting=True, base_image_seq_len=4, max_image_seq_len=64),
    "sde-dpm-solver++-2m-flow-sigmas": lambda: DPMSolverMultistepScheduler(
        algorithm_type="sde-dpmsolver++", solver_order=2, use_flow_sigmas=True, prediction_type="flow_prediction",
        use_dynamic_shifting=True, time_shift_type="exponential"),
}


@pytest.fixture(scope="module")
def guided_flux(pipes):
    """The tiny Flux with a guidance-embedding transformer (the distilled ``guidance`` input is used)."""
    flux = pipes["flux"]
    torch.manual_seed(1)
    transformer = FluxTransformer2DModel.from_config({**flux.transformer.config, "guidance_embeds": True}).eval()
    return type(flux)(**{**flux.components, "transformer": transformer})


@pytest.mark.parametrize("scheduler_name", list(FLUX_SCHEDULERS))
def test_flux_plain_equals_the_pipeline_with_true_cfg_guidance_embeds_and_its_decoder(guided_flux, scheduler_name):
    """The dynamic shift ``mu``, the distilled ``guidance``, true CFG (negative rows batched with the positive
    ones) and the decoder (unpacked, shifted, decoded, postprocessed) give the pipeline's own images."""
    pipe = _with(guided_flux, FLUX_SCHEDULERS[scheduler_name]())
    call = {"prompt": [PROMPT, "a blue bird"], "negative_prompt": ["a cat", "a dog"], "true_cfg_scale": 2.5,
            "guidance_scale": 3.5, "max_sequence_length": 8, "height": 16, "width": 16, "output_type": "pt",
            "num_inference_steps": STEPS}
    g = torch.Generator().manual_seed(4)
    with step_noise_from(pipe, g, halves=False):
        direct = pipe(generator=g, **call).images
    methods = ["coupling"] + (["autospec"] if type(pipe.scheduler).__name__ in AUTOSPEC else [])
    for method in methods:
        spec = SpeculativePipeline.from_pipe(pipe, method=method)
        plain = spec.plain(generator=torch.Generator().manual_seed(4), **call)
        assert plain.spec_stats.target_calls == STEPS
        torch.testing.assert_close(plain.images, direct, atol=1e-5, rtol=1e-5, msg=f"{method} + {scheduler_name}")
        assert not torch.allclose(plain.images, spec.plain(generator=torch.Generator().manual_seed(4),
                                                           **{**call, "true_cfg_scale": 1.0}).images, atol=1e-3)


def test_flux_speculates_and_refuses_what_it_cannot_honour(pipes):
    pipe = _with(pipes["flux"], SCHEDULERS["flow-stochastic"]())
    call = {**_call("flux", "flow-stochastic"), "num_inference_steps": 48}
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling", lookahead=4)
    seen = []
    out = spec(generator=torch.Generator().manual_seed(4), callback_on_step_end=lambda p, i, t, kw: seen.append(
        (i, sorted(kw))), callback_on_step_end_tensor_inputs=["latents", "prompt_embeds"], **call)
    assert out.images.shape == (2, 16, 16) and torch.isfinite(out.images).all()  # packed latents
    assert spec.stats.target_calls <= 48 and 0 < spec.stats.accepted < spec.stats.proposed, spec.stats
    assert seen[-1][0] == 46 and all(keys == ["latents", "prompt_embeds"] for _, keys in seen)  # last round: step 46, as on SD3
    for name in ("sigmas", "ip_adapter_image_embeds"):
        with pytest.raises(ValueError, match=f"{name}= is not supported"):
            spec(**{**call, name: [0.5]})
    with pytest.raises(ValueError, match="true_cfg_scale=2.0: the negative prompt embeddings"):
        spec(negative_prompt="a cat", true_cfg_scale=2.0, **call)  # one negative prompt for two prompts
