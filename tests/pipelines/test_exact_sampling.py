"""`coupling` (drafts x0 and the experimental forecast) and `autospec` are exact: their samples have the plain stochastic sampler's law.

Two-sample tests (energy distance with a permutation test, per-coordinate KS with Bonferroni) on
1000 final latents per arm; a planted bug (acceptance without reflection) must fail the same test.
"""

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DDPMScheduler,
    DiTPipeline,
    DiTTransformer2DModel,
    DPMSolverMultistepScheduler,
    DPMSolverSinglestepScheduler,
    EulerDiscreteScheduler,
)

import diffspec.schedulers.speculative as speculative
from diffspec import AutospecConfig, CouplingConfig, SpeculativePipeline
from diffspec.bench.twosample import same_law
from diffspec.models import load_pipeline
from diffspec.schedulers.gaussian import GaussianTransition
from diffspec.schedulers.speculative import SpeculativeSampler
from diffspec.stats import SpecStats

N = 1000


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def build_random_dit(scheduler=None):
    """A one-layer learned-sigma DiT (4x4x4 latents) with a one-block VAE."""
    torch.manual_seed(0)
    transformer = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                        num_layers=1, sample_size=4, patch_size=2, num_embeds_ada_norm=1000).eval()
    vae = AutoencoderKL(block_out_channels=(4,), layers_per_block=1, latent_channels=4, norm_num_groups=1)
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=scheduler or DDPMScheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def random_dit_pipe():
    return build_random_dit()


def _latents(spec, seed, steps, guidance=4.0, plain=False):
    run = spec.plain if plain else spec
    labels = [i % 10 for i in range(N)]
    return run(class_labels=labels, num_inference_steps=steps, guidance_scale=guidance, output_type="latent",
               generator=torch.Generator().manual_seed(seed)).images


@pytest.fixture(scope="module")
def random_dit_plain(random_dit_pipe):
    spec = SpeculativePipeline.from_pipe(random_dit_pipe, method="coupling")
    return _latents(spec, seed=1, steps=40, plain=True)


@pytest.mark.parametrize("method, draft", [("coupling", "x0"), ("autospec", None), ("coupling", "forecast")])
def test_random_dit_samples_have_the_plain_law(random_dit_pipe, random_dit_plain, method, draft):
    spec = SpeculativePipeline.from_pipe(random_dit_pipe, method=method, lookahead=4, **({"draft": draft} if draft else {}))
    samples = _latents(spec, seed=2, steps=40)
    stats = spec.stats
    assert 0.1 < stats.acceptance_rate < 0.98, stats.acceptance_rate  # both accepts and reflections happened
    assert stats.target_calls < 40
    report = same_law(random_dit_plain, samples)
    assert report["passed"], report


@pytest.mark.parametrize("draft", ["x0", "forecast"])
def test_a_planted_bias_fails_the_same_test(random_dit_pipe, random_dit_plain, monkeypatch, draft):
    original = speculative.reflection_coupling

    def keep_every_draft(draft, noise, draft_mean, target_mean, std, uniform):
        out = original(draft, noise, draft_mean, target_mean, std, uniform)
        return type(out)(torch.ones_like(out.accepted), draft, out.log_ratio, out.delta)

    monkeypatch.setattr(speculative, "reflection_coupling", keep_every_draft)
    spec = SpeculativePipeline.from_pipe(random_dit_pipe, method="coupling", lookahead=4, draft=draft)
    report = same_law(random_dit_plain, _latents(spec, seed=2, steps=40))
    assert not report["passed"], report


@pytest.mark.slow
def test_trained_tiny_dit_samples_have_the_plain_law():
    pipe = load_pipeline("tiny-dit")
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    torch.set_num_threads(max(2, torch.get_num_threads()))  # a real model: matrix work, more threads help
    spec = SpeculativePipeline.from_pipe(pipe, method="coupling", lookahead=2)
    plain = _latents(spec, seed=1, steps=12, guidance=1.0, plain=True)  # 1000 samples: keep the rows few
    for method in ("coupling", "autospec"):
        spec = SpeculativePipeline.from_pipe(pipe, method=method, lookahead=2)
        samples = _latents(spec, seed=2, steps=12, guidance=1.0)
        # a batch of 1000 waits for its slowest trajectory, so only the acceptance is checked here
        assert spec.stats.accepted > 0, (method, spec.stats)
        report = same_law(plain, samples)
        assert report["passed"], (method, report)
    torch.set_num_threads(1)


@pytest.mark.slow
def test_sde_dpm_solver_2m_pipeline_samples_have_the_plain_law(random_dit_pipe):
    """The multistep history through the whole pipeline (DiT, CFG off, 100 steps: acceptance about 0.35)."""
    scheduler = DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", solver_order=2)
    pipe = DiTPipeline(transformer=random_dit_pipe.transformer, vae=random_dit_pipe.vae, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    run = lambda spec, seed: spec(class_labels=[i % 10 for i in range(400)], num_inference_steps=100,  # noqa: E731
                                  guidance_scale=1.0, output_type="latent",
                                  generator=torch.Generator().manual_seed(seed)).images
    plain = run(SpeculativePipeline.from_pipe(pipe, method="coupling").plain, 1)
    for method in ("coupling", "autospec"):
        spec = SpeculativePipeline.from_pipe(pipe, method=method, lookahead=4)
        report = same_law(plain, run(spec, 2))
        assert 0.1 < spec.stats.acceptance_rate < 0.98, (method, spec.stats.acceptance_rate)
        assert report["passed"], (method, report)


def test_a_perfect_draft_is_always_accepted_and_lookahead_one_is_one_call_a_step():
    kernel = GaussianTransition(DDPMScheduler(), 30)
    target_x0 = torch.randn(1, 4, 4, 4)

    def denoise(x, steps, traj):  # predicts the same clean sample everywhere: the frozen-x0 draft is exact
        a = kernel.a_t[steps].view(-1, 1, 1, 1)
        return (x - a**0.5 * target_x0) / (1 - a) ** 0.5

    stats = SpecStats()
    out = SpeculativeSampler(kernel, denoise, CouplingConfig(lookahead=8, adaptive=False), stats).sample(
        torch.randn(3, 4, 4, 4), torch.Generator().manual_seed(0))
    assert stats.accepted == stats.proposed > 0 and stats.target_calls == 1 + 4 + 1  # 28 steps in rounds of 8
    assert torch.isfinite(out).all()
    stats = SpecStats()
    SpeculativeSampler(kernel, denoise, CouplingConfig(lookahead=1, adaptive=False), stats).sample(torch.randn(3, 4, 4, 4))
    assert stats.target_calls == 30


def test_unsupported_schedulers_and_pipelines_are_clear_errors(random_dit_pipe):
    pipe = DiTPipeline(transformer=random_dit_pipe.transformer, vae=random_dit_pipe.vae,
                       scheduler=EulerDiscreteScheduler())
    with pytest.raises(ValueError, match="EulerDiscreteScheduler is deterministic"):
        SpeculativePipeline.from_pipe(pipe, method="coupling")
    pipe.scheduler = DDIMScheduler()  # DiTPipeline never passes eta: deterministic DDIM, whatever the config says
    with pytest.raises(ValueError, match="DiTPipeline calls DDIMScheduler.step without eta"):
        SpeculativePipeline.from_pipe(pipe, method="coupling", eta=0.5)
    pipe.scheduler = DPMSolverSinglestepScheduler(algorithm_type="sde-dpmsolver++", solver_order=1)
    SpeculativePipeline.from_pipe(pipe, method="coupling")
    with pytest.raises(ValueError, match="'autospec' .* needs DDPMScheduler"):
        SpeculativePipeline.from_pipe(pipe, method="autospec")
    with pytest.raises(ValueError, match=r"lookahead=0 is out of range"):
        CouplingConfig(lookahead=0)
    with pytest.raises(ValueError, match=r"draft='eps'"):
        CouplingConfig(draft="eps")
    with pytest.raises(ValueError, match=r"max_lookahead=2 is out of range"):
        AutospecConfig(lookahead=4, max_lookahead=2)


def test_disable_runs_the_pipeline_itself(random_dit_pipe):
    spec = SpeculativePipeline.from_pipe(random_dit_pipe, method="coupling")
    spec.disable()
    torch.manual_seed(3)
    wrapped = spec(class_labels=[1, 2], num_inference_steps=5, output_type="pt",
                   generator=torch.Generator().manual_seed(0)).images
    torch.manual_seed(3)
    direct = random_dit_pipe(class_labels=[1, 2], num_inference_steps=5, output_type="pt",
                             generator=torch.Generator().manual_seed(0)).images
    assert torch.equal(wrapped, direct)


@pytest.mark.parametrize("method", ["coupling", "autospec"])
def test_one_generator_per_item_makes_a_sample_independent_of_its_batch(random_dit_pipe, method):
    """diffusers' list-of-generators convention: each trajectory draws from its own generator."""
    spec = SpeculativePipeline.from_pipe(random_dit_pipe, method=method, lookahead=3)

    def run(seeds, labels):
        return spec(class_labels=labels, num_inference_steps=12, output_type="latent",
                    generator=[torch.Generator().manual_seed(s) for s in seeds]).images

    together = run([5, 6, 7], [1, 2, 3])
    alone = run([6], [2])
    assert torch.allclose(together[1:2], alone, atol=1e-5)
    plain = spec.plain(class_labels=[1, 2], num_inference_steps=6, output_type="latent",
                       generator=[torch.Generator().manual_seed(s) for s in (5, 6)]).images
    assert plain.shape[0] == 2 and torch.isfinite(plain).all()


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_autospec_takes_one_generator_per_item_at_any_batch(random_dit_pipe, batch):
    """Rounds with nothing to couple (a last step, a lookahead of 1) draw no uniforms from the list."""
    for lookahead in (1, 4):
        spec = SpeculativePipeline.from_pipe(random_dit_pipe, method="autospec", lookahead=lookahead)
        out = spec(class_labels=list(range(batch)), num_inference_steps=12, output_type="latent",
                   generator=[torch.Generator().manual_seed(s) for s in range(batch)]).images
        assert out.shape == (batch, 4, 4, 4) and torch.isfinite(out).all()


@pytest.mark.parametrize("spacing", ["trailing", "leading"])
def test_autospec_with_nothing_to_verify_skips_the_call_and_equals_plain_at_lookahead_one(random_dit_pipe, spacing):
    """With ``"trailing"`` spacing every step is stochastic (the last timestep is not 0), so the last round
    has one exact step and no state to evaluate; it must make no transformer call. At lookahead 1 every
    round is such a round: ``autospec`` is the plain sampler, same noise, same calls."""
    scheduler = DDPMScheduler(prediction_type="v_prediction", variance_type="fixed_large", timestep_spacing=spacing)
    pipe = DiTPipeline(transformer=random_dit_pipe.transformer, vae=random_dit_pipe.vae, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    call = {"class_labels": [1, 2], "num_inference_steps": 10, "output_type": "latent"}
    spec = SpeculativePipeline.from_pipe(pipe, method="autospec", lookahead=1, adaptive=False)
    out = spec(generator=torch.Generator().manual_seed(0), **call).images
    assert spec.stats.target_calls == 10 and spec.stats.proposed == 0
    plain = spec.plain(generator=torch.Generator().manual_seed(0), **call).images
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=1e-6)
    spec = SpeculativePipeline.from_pipe(pipe, method="autospec", lookahead=4)
    for seed in range(6):  # some seeds reach the last step alone
        spec(generator=torch.Generator().manual_seed(seed), **call)
