"""`coupling` / `autospec` on PixArt-alpha/Sigma and SD3 pipelines: the plain path is the pipeline's own
sampler, and speculative samples have its law (energy permutation test + Bonferroni KS).

Tiny random-weight pipelines built from configs (one-layer text encoders, word-level tokenizers,
4x4x4 latents); no download.
"""

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    DPMSolverSinglestepScheduler,
    FlowMatchEulerDiscreteScheduler,
    LTXEulerAncestralRFScheduler,
    PixArtAlphaPipeline,
    PixArtSigmaPipeline,
    PixArtTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)

import diffspec.schedulers.speculative as speculative
from diffspec import SpeculativePipeline
from diffspec.bench.twosample import same_law
from diffspec.testing.pipeline_parts import build_word_tokenizer, t5_encoder, word_vocab_size

PROMPT = "a red fox in the snow"
TEXT = {"max_sequence_length": 8, "height": 8, "width": 8}
FAST_N, SLOW_N = 300, 1000


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _vae(**kw):
    return AutoencoderKL(block_out_channels=(4, 4), down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                         norm_num_groups=1, **kw).eval()


def build_pixart(cls=PixArtAlphaPipeline, scheduler=None, sample_size=128):
    """Alpha at sample size 128 uses the resolution / aspect-ratio micro-conditions; learned sigma."""
    torch.manual_seed(0)
    transformer = PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=8,
                                           num_layers=1, cross_attention_dim=24, caption_channels=24,
                                           sample_size=sample_size, patch_size=2,
                                           use_additional_conditions=sample_size == 128).eval()
    pipe = cls(tokenizer=build_word_tokenizer(120), text_encoder=t5_encoder(24), vae=_vae(), transformer=transformer,
               scheduler=scheduler or DDPMScheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_sd3(scheduler=None):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(sample_size=4, patch_size=2, in_channels=4, out_channels=4, num_layers=1,
                                        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                        caption_projection_dim=16, pooled_projection_dim=32,
                                        pos_embed_max_size=8).eval()
    clip = [CLIPTextModelWithProjection(CLIPTextConfig(vocab_size=word_vocab_size(), hidden_size=8, intermediate_size=16,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       max_position_embeddings=77, projection_dim=16)).eval()
            for _ in range(2)]
    pipe = StableDiffusion3Pipeline(transformer=transformer, vae=_vae(shift_factor=0.1, scaling_factor=1.5),
                                    text_encoder=clip[0], tokenizer=build_word_tokenizer(77), text_encoder_2=clip[1],
                                    tokenizer_2=build_word_tokenizer(77), text_encoder_3=None, tokenizer_3=None,
                                    scheduler=scheduler or FlowMatchEulerDiscreteScheduler(stochastic_sampling=True,
                                                                                           shift=3.0))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _kwargs(pipe):
    extra = {"use_resolution_binning": False, "clean_caption": False} if "PixArt" in type(pipe).__name__ else {}
    return {**TEXT, **extra}


def _latents(run, pipe, n, seed, steps, guidance):
    return run(PROMPT, num_images_per_prompt=n, num_inference_steps=steps, guidance_scale=guidance,
               output_type="latent", generator=torch.Generator().manual_seed(seed), **_kwargs(pipe)).images


@pytest.mark.parametrize("build,bitwise", [
    (lambda: build_pixart(), True),
    (lambda: build_pixart(PixArtSigmaPipeline, DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++",
                                                                           solver_order=1), sample_size=32), True),
    (lambda: build_pixart(PixArtSigmaPipeline, DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++",
                                                                           solver_order=2), sample_size=32),
     False),  # the pure multistep mean re-associates diffusers' update: float tolerance (relative 1e-7 here)
    (lambda: build_sd3(), True),
    (lambda: build_sd3(LTXEulerAncestralRFScheduler()), False),  # its mean is re-associated: float tolerance
], ids=["pixart-alpha-ddpm", "pixart-sigma-sde-dpmsolver++", "pixart-sigma-sde-dpmsolver++-2m", "sd3-flow-stochastic",
        "sd3-ltx-euler-ancestral-rf"])
@pytest.mark.parametrize("output_type", ["latent", "np"])
def test_the_plain_path_is_the_pipelines_own_stochastic_sampler(build, bitwise, output_type):
    """Same generator, same images: latents from the pipeline's prepare_latents, one noise draw a step.

    SD3's loop calls ``scheduler.step`` without the generator (global RNG); the test hands it the
    call's generator so both draw the same noise stream.
    """
    pipe = build()
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling")
    g = torch.Generator().manual_seed(3)
    step = pipe.scheduler.step
    if isinstance(pipe, StableDiffusion3Pipeline):
        pipe.scheduler.step = lambda *args, **kw: step(*args, generator=g, **kw)
    call = dict(num_images_per_prompt=2, num_inference_steps=6, guidance_scale=3.0, output_type=output_type,
                **_kwargs(pipe))
    direct = torch.as_tensor(pipe([PROMPT, "a blue bird"], generator=g, **call).images)
    pipe.scheduler.step = step
    plain = spec.plain([PROMPT, "a blue bird"], generator=torch.Generator().manual_seed(3), **call)
    images = torch.as_tensor(plain.images)
    assert images.shape == direct.shape == ((4, 4, 4, 4) if output_type == "latent" else (4, 8, 8, 3))
    assert torch.equal(images, direct) if bitwise else torch.allclose(images, direct, atol=1e-5)
    assert plain.spec_stats.target_calls == 6


@pytest.fixture(scope="module")
def pixart():
    return build_pixart()


@pytest.fixture(scope="module")
def sd3():
    return build_sd3()


PIXART_STEPS, SD3_STEPS = 16, 16


@pytest.fixture(scope="module")
def pixart_plain(pixart):
    spec = SpeculativePipeline.from_pipe(pixart, method="coupling")
    return _latents(spec.plain, pixart, FAST_N, 1, PIXART_STEPS, 4.5)


@pytest.fixture(scope="module")
def sd3_plain(sd3):
    spec = SpeculativePipeline.from_pipe(sd3, method="coupling")
    return _latents(spec.plain, sd3, FAST_N, 1, SD3_STEPS, 5.0)


@pytest.mark.parametrize("method", ["coupling", "autospec"])
def test_pixart_speculative_samples_have_the_plain_law(pixart, pixart_plain, method):
    spec = SpeculativePipeline.from_pipe(pixart, method=method, lookahead=4)
    samples = _latents(spec, pixart, FAST_N, 2, PIXART_STEPS, 4.5)
    assert 0 < spec.stats.accepted < spec.stats.proposed, spec.stats  # both accepts and reflections
    report = same_law(pixart_plain, samples)
    assert report["passed"], report


@pytest.mark.parametrize("order", [2, 3])
def test_pixart_sigma_higher_order_sde_dpm_solver_has_the_plain_law(order):
    """Multistep SDE-DPM-Solver++ (PixArt's solver family) at order 2 and 3: the solver history is carried
    through accepted and reflected rounds, so the speculative samples keep the plain sampler's law."""
    pipe = build_pixart(PixArtSigmaPipeline, DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++",
                                                                         solver_order=order), sample_size=32)
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling", lookahead=4)
    steps = 48  # on this random-weight model SDE-DPM drafts are accepted only with small steps (none at 16)
    plain = _latents(spec.plain, pipe, FAST_N, 1, steps, 4.5)
    samples = _latents(spec, pipe, FAST_N, 2, steps, 4.5)
    assert 0 < spec.stats.accepted < spec.stats.proposed, spec.stats
    report = same_law(plain, samples)
    assert report["passed"], report


@pytest.mark.parametrize("order", [2, 3])
def test_sd3_with_flow_sde_dpm_solver_of_higher_order_has_the_plain_law(order):
    """SD3 with multistep SDE-DPM-Solver++ on flow sigmas (velocity prediction), orders 2 and 3."""
    pipe = build_sd3(DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=order,
                                                 use_flow_sigmas=True, prediction_type="flow_prediction",
                                                 flow_shift=3.0))
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling", lookahead=4)
    plain = _latents(spec.plain, pipe, FAST_N, 1, 24, 5.0)
    samples = _latents(spec, pipe, FAST_N, 2, 24, 5.0)
    assert 0 < spec.stats.accepted < spec.stats.proposed, spec.stats
    assert spec.stats.target_calls < 24
    report = same_law(plain, samples)
    assert report["passed"], report


def test_sd3_flow_speculative_samples_have_the_plain_law(sd3, sd3_plain):
    spec = SpeculativePipeline.from_pipe(sd3, method="coupling", lookahead=4)
    samples = _latents(spec, sd3, FAST_N, 2, SD3_STEPS, 5.0)
    assert 0 < spec.stats.accepted < spec.stats.proposed, spec.stats
    report = same_law(sd3_plain, samples)
    assert report["passed"], report


def test_sd3_with_the_ltx_euler_ancestral_rf_scheduler_has_the_plain_law():
    pipe = build_sd3(LTXEulerAncestralRFScheduler())
    plain = _latents(SpeculativePipeline.from_pipe(pipe, method="coupling").plain, pipe, FAST_N, 1, SD3_STEPS, 5.0)
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling", lookahead=4)
    samples = _latents(spec, pipe, FAST_N, 2, SD3_STEPS, 5.0)
    assert 0 < spec.stats.accepted < spec.stats.proposed, spec.stats
    report = same_law(plain, samples)
    assert report["passed"], report


@pytest.mark.parametrize("case", ["pixart-coupling", "pixart-autospec", "sd3-coupling"])
def test_one_image_takes_fewer_sequential_transformer_calls_than_steps(pixart, sd3, case):
    """A batch waits for its slowest image, so the call count is measured one image at a time."""
    pipe = pixart if case.startswith("pixart") else sd3
    spec = SpeculativePipeline.from_pipe(pipe, method=case.split("-")[1], lookahead=4)
    calls = []
    for seed in range(3):
        _latents(spec, pipe, 1, seed, 40, 4.5)
        calls.append(spec.stats.target_calls)
    assert max(calls) < 40, (calls, spec.stats)


def _keep_every_draft(monkeypatch):
    original = speculative.reflection_coupling

    def keep(draft, noise, draft_mean, target_mean, std, uniform):
        out = original(draft, noise, draft_mean, target_mean, std, uniform)
        return type(out)(torch.ones_like(out.accepted), draft, out.log_ratio, out.delta)

    monkeypatch.setattr(speculative, "reflection_coupling", keep)


def test_a_planted_bias_fails_the_same_test_on_sd3_flow(sd3, sd3_plain, monkeypatch):
    _keep_every_draft(monkeypatch)
    spec = SpeculativePipeline.from_pipe(sd3, method="coupling", lookahead=4)
    report = same_law(sd3_plain, _latents(spec, sd3, FAST_N, 2, SD3_STEPS, 5.0))
    assert not report["passed"], report


def test_callback_on_step_end_runs_once_per_round_and_can_replace_latents(sd3):
    spec = SpeculativePipeline.from_pipe(sd3, method="coupling", lookahead=3, adaptive=False)
    seen = []

    def callback(pipe, step, t, kwargs):
        seen.append((step, float(t), tuple(kwargs["latents"].shape), tuple(kwargs["prompt_embeds"].shape)))
        return {"latents": kwargs["latents"] * 0} if step == 8 else {}

    out = spec(PROMPT, num_inference_steps=10, num_images_per_prompt=2, guidance_scale=2.0, output_type="latent",
               callback_on_step_end=callback, callback_on_step_end_tensor_inputs=["latents", "prompt_embeds"],
               generator=torch.Generator().manual_seed(0), **TEXT)
    steps = [s for s, *_ in seen]
    assert len(seen) == spec.stats.target_calls - 2 and steps == sorted(steps) and steps[-1] == 8
    assert seen[0][2] == (2, 4, 4, 4) and seen[0][3][0] == 4  # latents per image, embeddings with CFG rows
    assert float(seen[-1][1]) == float(spec.pipe.scheduler.timesteps[8])  # the pipeline's schedule is set
    # zeroed at step 8 (sigma 0.x), the last step maps x to (1 - 0) * x0(x): the transformer's output decides
    assert out.images.shape == (2, 4, 4, 4) and torch.isfinite(out.images).all()


def test_unsupported_configurations_are_clear_errors(pixart, sd3):
    sde2 = DPMSolverSinglestepScheduler(algorithm_type="sde-dpmsolver++", solver_order=2)  # multistep 2 works
    with pytest.raises(ValueError, match="use solver_order=1"):
        SpeculativePipeline.from_pipe(build_pixart(scheduler=sde2), method="coupling")
    with pytest.raises(ValueError, match="'autospec' .* needs DDPMScheduler"):
        SpeculativePipeline.from_pipe(sd3, method="autospec")
    spec = SpeculativePipeline.from_pipe(sd3, method="coupling")
    with pytest.raises(ValueError, match="sigmas= is not supported"):
        spec(PROMPT, sigmas=[1.0, 0.5], **TEXT)
    with pytest.raises(TypeError):
        spec(PROMPT, not_an_argument=1, **TEXT)
    ode = build_sd3(FlowMatchEulerDiscreteScheduler())
    with pytest.raises(ValueError, match="stochastic_sampling=False is deterministic"):
        SpeculativePipeline.from_pipe(ode, method="coupling")


@pytest.fixture(scope="module")
def slow_arms():
    """Per pipeline kind: the pipeline and its plain sampler's 1000 samples (shared by the slow cases)."""
    cache = {}

    def get(kind):
        if kind not in cache:
            pipe = build_pixart() if kind == "pixart" else build_sd3()
            plain = SpeculativePipeline.from_pipe(pipe, method="coupling").plain
            cache[kind] = pipe, _latents(plain, pipe, SLOW_N, 1, SLOW_STEPS, 4.5)
        return cache[kind]

    return get


SLOW_STEPS = 20


@pytest.mark.slow
@pytest.mark.parametrize("case", ["pixart-coupling", "pixart-autospec", "sd3-coupling", "sd3-planted"])
def test_exactness_at_1000_samples(slow_arms, case, monkeypatch):
    kind, method = case.split("-")
    pipe, plain = slow_arms(kind)
    if method == "planted":
        _keep_every_draft(monkeypatch)
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling" if method == "planted" else method, lookahead=4)
    samples = _latents(spec, pipe, SLOW_N, 2, SLOW_STEPS, 4.5)
    # a batch of 1000 waits for its slowest image: calls per image are tested at batch 1 above
    assert 0 < spec.stats.accepted <= spec.stats.proposed, spec.stats
    report = same_law(plain, samples)
    if method == "planted":
        assert not report["passed"], report
    else:
        assert spec.stats.accepted < spec.stats.proposed and report["passed"], (spec.stats, report)
