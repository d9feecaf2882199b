"""The ``diffspec Speculative Sampler`` SAMPLER: ComfyUI's step laws, exactness, call counts, node contract."""

import sys
from unittest import mock

import pytest
import torch
from comfy_fakes import FakeKSAMPLER, MixtureDenoiser, fake_comfy_modules

import diffspec.schedulers.speculative as speculative
from diffspec.bench.twosample import same_law
from diffspec.comfyui import NODE_CLASS_MAPPINGS, SamplerStats, SpeculativeRun, SpeculativeSamplerNode
from diffspec.comfyui.sampler import block_layout, sample_speculative
from diffspec.kernels import Coupled, reflection_coupling
from diffspec.schedulers.sigma import SigmaTransition

VP_SIGMAS = torch.tensor([14.6, 8.0, 5.0, 3.0, 2.0, 1.2, 0.7, 0.4, 0.2, 0.1, 0.0])
FLOW_SIGMAS = torch.linspace(1.0, 0.0, 11)
CASES = [("euler_ancestral", False, 1.0, 1.0), ("euler_ancestral", False, 0.6, 0.8),
         ("euler_ancestral", True, 1.0, 1.0), ("euler_ancestral", True, 0.6, 0.8), ("ddpm", False, 1.0, 1.0),
         ("ddpm", True, 1.0, 1.0)]


def comfy_step(kind, flow, x, den, s, t, eta, s_noise, noise):
    """One step as ComfyUI's comfy/k_diffusion/sampling.py takes it (the test oracle, scalar sigmas)."""
    if kind == "ddpm":  # generic_step_sampler + DDPMSampler_step, for any model type
        ac, ac_prev = 1 / (s * s + 1), 1 / (t * t + 1)
        alpha = ac / ac_prev
        mu = (1 / alpha) ** 0.5 * (x / (1 + s * s) ** 0.5 - (1 - alpha) * ((x - den) / s) / (1 - ac) ** 0.5)
        if t > 0:
            mu = mu + ((1 - alpha) * (1 - ac_prev) / (1 - ac)) ** 0.5 * noise
            mu = mu * (1 + t * t) ** 0.5
        return mu
    if flow:  # sample_euler_ancestral_RF
        if t == 0:
            return den
        down = t * (1 + (t / s - 1) * eta)
        a_next, a_down = 1 - t, 1 - down
        x = down / s * x + (1 - down / s) * den
        return a_next / a_down * x + noise * s_noise * (t**2 - down**2 * a_next**2 / a_down**2) ** 0.5
    up = min(t, eta * (t**2 * (s**2 - t**2) / s**2) ** 0.5)  # get_ancestral_step
    down = (t**2 - up**2) ** 0.5
    if down == 0:
        return den
    return x + (x - den) / s * (down - s) + noise * s_noise * up


def comfy_sample(kind, flow, model, x, sigmas, seed, eta=1.0, s_noise=1.0):
    """ComfyUI's sampler loop with its default noise sampler (a CPU generator seeded ``seed + 1``)."""
    g = torch.Generator().manual_seed(seed + 1)
    s_in = x.new_ones(x.shape[0])
    for i in range(len(sigmas) - 1):
        s, t = float(sigmas[i]), float(sigmas[i + 1])
        den = model(x, sigmas[i] * s_in)
        noise = torch.randn(x.size(), generator=g) if t > 0 else torch.zeros_like(x)
        x = comfy_step(kind, flow, x, den, s, t, eta, s_noise, noise)
    return x


def _spec(model, x, sigmas, seed, kind="euler_ancestral", **kw):
    return sample_speculative(model, x.clone(), sigmas, {"seed": seed}, disable=True, kind=kind, **kw)


@pytest.mark.parametrize("kind,flow,eta,s_noise", CASES)
def test_kernel_is_comfys_step_law(kind, flow, eta, s_noise):
    sigmas = FLOW_SIGMAS if flow else VP_SIGMAS
    kernel = SigmaTransition(sigmas, kind, flow=flow, eta=eta, s_noise=s_noise)
    g = torch.Generator().manual_seed(0)
    for i in range(kernel.num_steps):
        x, den, noise = (torch.randn(3, 8, generator=g) * 3 for _ in range(3))
        steps = torch.full((3,), i)
        ours = kernel.mean(x, steps, den) + kernel.std[i] * noise
        ref = comfy_step(kind, flow, x, den, float(sigmas[i]), float(sigmas[i + 1]), eta, s_noise, noise)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert kernel.stochastic_steps() == kernel.num_steps - 1 and float(kernel.std[-1]) == 0.0


@pytest.mark.parametrize("kind,flow,eta,s_noise", CASES)
def test_lookahead_one_is_comfys_sampler(kind, flow, eta, s_noise):
    sigmas = FLOW_SIGMAS if flow else VP_SIGMAS
    model = MixtureDenoiser(flow)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(3)) * sigmas[0]
    ref = comfy_sample(kind, flow, model, x.clone(), sigmas, seed=7, eta=eta, s_noise=s_noise)
    calls = model.calls
    ours = _spec(model, x, sigmas, 7, kind, lookahead=1, adaptive=False, eta=eta, s_noise=s_noise)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert model.calls - calls == len(sigmas) - 1


def test_vp_ddpm_is_euler_ancestral_at_eta_one():
    """An identity between two independently written tables: in sigma space the DDPM posterior step
    of a noise-prediction model is Euler-ancestral with eta = 1."""
    a, b = SigmaTransition(VP_SIGMAS, "ddpm"), SigmaTransition(VP_SIGMAS, "euler_ancestral")
    for name in ("c_x", "c_x0", "std"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6)


def _always_accept(draft, noise, draft_mean, target_mean, std, uniform):
    out = reflection_coupling(draft, noise, draft_mean, target_mean, std, uniform)
    return Coupled(torch.ones_like(out.accepted), draft, out.log_ratio, out.delta)


@pytest.mark.parametrize("kind,flow", [("euler_ancestral", False), ("euler_ancestral", True), ("ddpm", True)])
def test_same_law_as_the_plain_sampler_and_a_planted_bias_is_caught(kind, flow):
    sigmas = FLOW_SIGMAS if flow else VP_SIGMAS
    model, n = MixtureDenoiser(flow), 400
    noise = lambda seed: torch.randn(n, 8, generator=torch.Generator().manual_seed(seed)) * sigmas[0]  # noqa: E731
    plain = comfy_sample(kind, flow, model, noise(1), sigmas, seed=11)
    run = SpeculativeRun()
    spec = _spec(model, noise(2), sigmas, 12, kind, lookahead=4, run=run)
    report = same_law(plain, spec)
    assert report["passed"], report
    assert 0 < run.stats.accepted < run.stats.proposed  # drafts were both kept and reflected
    if kind == "euler_ancestral" and flow:  # the verifier removed: drafts always kept
        with mock.patch.object(speculative, "reflection_coupling", _always_accept):
            biased = _spec(model, noise(2), sigmas, 12, kind, lookahead=4)
        assert not same_law(plain, biased)["passed"]


@pytest.mark.parametrize("flow", [False, True])
def test_fewer_model_calls_than_steps(flow):
    sigmas = torch.linspace(1.0, 0.0, 51) if flow else torch.cat([torch.logspace(1.2, -1.5, 50), torch.zeros(1)])
    model = MixtureDenoiser(flow)
    run = SpeculativeRun()
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(0)) * sigmas[0]
    _spec(model, x, sigmas, 0, lookahead=4, run=run)
    stats = run.stats
    assert stats.target_calls == model.calls < 0.6 * 50
    assert stats.target_evals == model.rows and stats.extra["padded_rows"] == 0
    assert max(len(set(s.tolist())) for s in model.sigma_rows) > 1  # one call, rows at several sigmas
    assert "sequential model calls" in run.summary() and run.runs == 1


def test_block_layout_puts_each_trajectory_in_its_batch_slot():
    g = torch.Generator().manual_seed(0)
    for batch in (1, 3, 5):
        traj = torch.sort(torch.randint(0, batch, (11,), generator=g)).values
        traj[: batch - 1] = torch.arange(batch - 1)  # some trajectories may have no row at all
        traj = torch.sort(traj).values
        source, slot = block_layout(traj, batch)
        counts = torch.bincount(traj, minlength=batch)
        assert source.numel() == batch * int(counts.max())
        assert torch.equal(source[slot], torch.arange(11))  # every row is computed once, at its slot
        owner = torch.arange(source.numel()) % batch  # ComfyUI tiles per-sample conds over these slots
        has_rows = counts[owner] > 0
        assert torch.equal(traj[source][has_rows], owner[has_rows])


def test_batched_trajectories_match_their_own_conditioning():
    """Per-sample conditioning through ComfyUI's tiling (cond batch B repeated over the rows): a model
    whose data mean depends on the sample's cond gives each trajectory its own law."""
    base = MixtureDenoiser(flow=True)
    offsets = torch.tensor([-3.0, 0.0, 3.0]).view(3, 1)

    def model(x, sigma, **kw):
        cond = offsets.repeat(x.shape[0] // 3, 1)  # comfy.utils.repeat_to_batch_size
        return base(x, sigma) + cond

    model.inner_model = base.inner_model
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    outs = torch.stack([_spec(model, x, FLOW_SIGMAS, seed, lookahead=4) for seed in range(40)])
    means = outs.mean((0, 2))
    assert means[0] < -2 and abs(means[1]) < 1.5 and means[2] > 2, means


def test_callback_reports_each_model_call():
    seen = []
    model = MixtureDenoiser(flow=True)
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    sample_speculative(model, x, FLOW_SIGMAS, {"seed": 0}, callback=seen.append, disable=True, lookahead=4)
    assert len(seen) == model.calls
    assert [d["i"] for d in seen] == sorted(d["i"] for d in seen) and seen[-1]["i"] <= 9
    assert all(d["x"].shape == d["denoised"].shape == x.shape for d in seen)


def test_invalid_settings_are_refused():
    model, x = MixtureDenoiser(), torch.randn(2, 8)
    with pytest.raises(ValueError, match="eta"):
        _spec(model, x, VP_SIGMAS, 0, eta=0.0)
    with pytest.raises(ValueError, match="noise mask"):
        sample_speculative(model, x, VP_SIGMAS, {"seed": 0, "denoise_mask": torch.ones(2, 8)})
    with pytest.raises(ValueError, match="non-increasing"):
        SigmaTransition(torch.tensor([1.0, 2.0, 0.0]))
    with pytest.raises(ValueError, match="kind"):
        SigmaTransition(VP_SIGMAS, "dpmpp_2m")
    out = sample_speculative(model, x[:1], VP_SIGMAS, {"seed": 0, "denoise_mask": torch.ones(1, 8)}, disable=True)
    assert out.shape == (1, 8)


def test_node_returns_a_ksampler_and_stats_report_the_run():
    assert NODE_CLASS_MAPPINGS["DiffspecSpeculativeSampler"] is SpeculativeSamplerNode
    with mock.patch.dict(sys.modules, fake_comfy_modules()):
        (sampler,) = SpeculativeSamplerNode().get_sampler("euler_ancestral", 4, True, 16, 1.0, 1.0)
    assert isinstance(sampler, FakeKSAMPLER) and sampler.sampler_function is sample_speculative
    stats = SamplerStats()
    assert "no sampling run yet" in stats.report(sampler, None)["result"][1]
    model = MixtureDenoiser(flow=True)
    out = sampler.run(model, torch.randn(1, 8), FLOW_SIGMAS, seed=0)
    report = stats.report(sampler, {"samples": out})
    assert report["result"][0] == {"samples": out}
    assert f"in {model.calls} sequential model calls" in report["ui"]["text"][0]
    assert "not a diffspec SAMPLER" in stats.report(FakeKSAMPLER(lambda *a, **k: None), None)["result"][1]
    with pytest.raises(ValueError, match="max_lookahead"):
        with mock.patch.dict(sys.modules, fake_comfy_modules()):
            SpeculativeSamplerNode().get_sampler("ddpm", 8, True, 4, 1.0, 1.0)
