"""Behaviour of the ComfyUI forecast adapter: forecast steps run no block, per-run reset, branches, gates."""

import math

import pytest
import torch
from comfy_fakes import (
    FakeBaseModel,
    FakeModelPatcher,
    ToyDouble,
    ToySingle,
    make_inputs,
    sample,
    toy_patcher,
)

from diffspec.comfyui import ComfyForecast, apply_forecast, forecast_of
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.gate import Schedule

STEPS = 16


def _count_block_runs(patcher):
    calls = {"n": 0}

    def hook(*_):
        calls["n"] += 1

    for module in patcher.model.diffusion_model.modules():
        if isinstance(module, (ToyDouble, ToySingle)):
            module.register_forward_pre_hook(hook)
    return calls


def test_forecast_steps_run_no_block():
    patcher = toy_patcher()
    patched = apply_forecast(patcher, ForecastConfig())
    calls = _count_block_runs(patcher)
    seen = []
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    base = sample(patcher, x0, sigmas, contexts)
    calls["n"] = 0
    out = sample(patched, x0, sigmas, contexts, on_step=lambda i: seen.append(calls["n"]))
    seen.append(calls["n"])
    ran = [b - a for a, b in zip(seen, seen[1:])]
    expected = Schedule.of(ForecastConfig()).without_rejections(STEPS)
    assert [r > 0 for r in ran] == expected
    assert set(ran) == {0, 5}  # a full step runs the 2 double + 3 single blocks once
    stats = forecast_of(patched).stats
    assert stats.full_steps == sum(expected) and stats.forecast_steps == STEPS - sum(expected)
    rel = ((out - base).norm() / base.norm()).item()
    assert 0 < rel < 0.05, rel


def test_interval_one_is_the_unpatched_model():
    patcher = toy_patcher()
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    out = sample(apply_forecast(patcher, ForecastConfig(interval=1)), x0, sigmas, contexts)
    assert torch.equal(out, sample(patcher, x0, sigmas, contexts))


def test_each_run_starts_fresh_and_leaves_nothing_behind():
    patcher = toy_patcher()
    patched = apply_forecast(patcher, SpecaConfig(tau0=0.1, beta=0.3, tau_min=0.02, k_min=1))
    forecast = forecast_of(patched)
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    first = sample(patched, x0, sigmas, contexts)
    stats_first = forecast.stats.to_dict()
    assert forecast.num_anchors_held == 0 and not forecast.branches and forecast.call is None
    second = sample(patched, x0, sigmas, contexts)
    assert torch.equal(first, second)
    stats_second = forecast.stats.to_dict()
    stats_first.pop("wall_s"), stats_second.pop("wall_s")
    assert stats_first == stats_second  # counters are per run, not accumulated
    assert forecast.runs == 2
    # a new step count in the next run works too
    x0, sigmas, contexts = make_inputs(steps=9)
    sample(patched, x0, sigmas, contexts)
    assert forecast.stats.full_steps + forecast.stats.forecast_steps >= 9


def test_interrupted_run_is_reset_in_finally():
    patcher = toy_patcher()
    patched = apply_forecast(patcher, ForecastConfig())
    forecast = forecast_of(patched)
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    reference = sample(patched, x0, sigmas, contexts)

    def interrupt(i):
        if i == 9:
            raise KeyboardInterrupt("user pressed cancel")

    with pytest.raises(KeyboardInterrupt):
        sample(patched, x0, sigmas, contexts, on_step=interrupt)
    assert forecast.num_anchors_held == 0 and not forecast.branches and forecast.call is None
    assert torch.equal(sample(patched, x0, sigmas, contexts), reference)


def test_conds_in_separate_calls_are_separate_branches():
    """ComfyUI may run cond and uncond in one batch or one call each: same samples either way."""
    patcher = toy_patcher()
    for config in (ForecastConfig(), SpecaConfig(tau0=0.05, beta=0.5, tau_min=0.01, k_min=0)):
        patched = apply_forecast(patcher, config)
        x0, sigmas, contexts = make_inputs(steps=STEPS)
        batched = sample(patched, x0, sigmas, contexts)
        batched_stats = forecast_of(patched).stats
        full_batched = batched_stats.full_steps
        separate = sample(patched, x0, sigmas, contexts, batched=False)
        torch.testing.assert_close(batched, separate, rtol=1e-5, atol=1e-6)
        assert forecast_of(patched).stats.full_steps >= full_batched  # counted per call


def test_speca_without_threshold_is_taylor_at_k_max():
    patcher = toy_patcher()
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    speca = sample(apply_forecast(patcher, SpecaConfig(tau0=math.inf, beta=1.0, tau_min=0.0, k_max=4)),
                   x0, sigmas, contexts)
    taylor = sample(apply_forecast(patcher, ForecastConfig(interval=4)), x0, sigmas, contexts)
    assert torch.equal(speca, taylor)


def test_speca_rejecting_everything_is_full_compute():
    patcher = toy_patcher()
    patched = apply_forecast(patcher, SpecaConfig(tau0=0.0, beta=1.0, tau_min=0.0, k_min=0))
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    out = sample(patched, x0, sigmas, contexts)
    torch.testing.assert_close(out, sample(patcher, x0, sigmas, contexts), rtol=1e-5, atol=1e-6)
    stats = forecast_of(patched).stats
    assert stats.forecast_steps == 0 and stats.extra["rejections"] == stats.proposed > 0
    assert stats.full_steps == STEPS and stats.extra["verifier_blocks"] == stats.draft_calls


def test_model_ignoring_the_patches_turns_forecasting_off(caplog):
    class NoPatches(torch.nn.Module):  # has block lists but never calls patches_replace
        def __init__(self):
            super().__init__()
            self.double_blocks = torch.nn.ModuleList([torch.nn.Identity()])

        def forward(self, x, timestep, context, transformer_options={}):  # noqa: B006
            return x * timestep.view(-1, 1, 1, 1)

    patcher = FakeModelPatcher(FakeBaseModel(NoPatches()))
    patched = apply_forecast(patcher, ForecastConfig())
    x0, sigmas, contexts = make_inputs(steps=8)
    with caplog.at_level("WARNING", logger="diffspec"):
        out = sample(patched, x0, sigmas, contexts)
    assert torch.equal(out, sample(patcher, x0, sigmas, contexts))
    assert "forecasting is off" in caplog.text and "disabled" in forecast_of(patched).summary()


def test_steps_are_located_in_the_sigma_schedule():
    fc = ComfyForecast(ForecastConfig(), [("double_block", 1)])
    fc.begin_run(torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    assert fc._locate(0.75, {}) == (1.0, 4)
    assert fc._locate(0.625, {}) == (1.5, 4)  # a midpoint evaluation (Heun, DPM-2...)
    options = {"sample_sigmas": torch.tensor([2.0, 1.0, 0.0])}
    assert fc._locate(1.0, options) == (1.0, 2)  # the run's own schedule wins
    fc.end_run()
    assert fc._locate(0.3, {}) == (0.0, None)  # no schedule: distinct sigmas are counted


def test_direct_calls_without_outer_sample_start_a_generation_on_rising_sigma():
    patcher = toy_patcher()
    patched = apply_forecast(patcher, ForecastConfig())
    forecast = forecast_of(patched)
    model = patched.model
    wrappers = patched.wrappers
    x0, sigmas, contexts = make_inputs(steps=6)
    options = {**patched.model_options["transformer_options"], "wrappers": wrappers}

    def run():
        x = x0
        for i in range(6):
            v = model.apply_model(x, sigmas[i:i + 1], None, contexts[0], None, options)
            x = x + (sigmas[i + 1] - sigmas[i]) * v
        return x

    first = run()
    assert forecast.stats.full_steps == 3 and forecast.stats.forecast_steps == 3  # warmup; no last step known
    assert torch.equal(run(), first)


def test_controlnet_residuals_added_between_blocks_are_not_added_twice_on_drafts(monkeypatch):
    """ComfyUI's Flux adds its ControlNet's residuals to the stream after each block, in place (``img += add``). A
    full step's list residual holds those added inside the list; a draft's last block takes the stream its first
    block drafted, so they are not added again on top of the forecast (the one after the last block still is)."""
    patcher = toy_patcher()
    g = torch.Generator().manual_seed(5)
    a, b = (0.3 * torch.randn(4, 1, 16, 32, generator=g) for _ in range(2))

    def control(timestep):  # smooth in the timestep, as a real ControlNet's residuals
        r = a + float(timestep.flatten()[0]) * b
        return {"input": [r[0], r[1]], "output": [r[2], r[3]]}

    x0, sigmas, contexts = make_inputs(steps=STEPS)
    plain = sample(patcher, x0, sigmas, contexts)
    patcher.model.diffusion_model.control = control
    base = sample(patcher, x0, sigmas, contexts)
    assert ((base - plain).norm() / plain.norm()).item() > 0.05  # the residuals matter
    assert torch.equal(sample(apply_forecast(patcher, ForecastConfig(interval=1)), x0, sigmas, contexts), base)
    accept = SpecaConfig(tau0=1e9, beta=1.0, tau_min=1e9, k_max=4, k_min=0, order=2)
    errors = {}
    for discard in (True, False):
        monkeypatch.setattr(ComfyForecast, "discard_between_blocks", discard)
        errors[discard] = [((sample(apply_forecast(patcher, cfg), x0, sigmas, contexts) - base).norm()
                            / base.norm()).item() for cfg in (ForecastConfig(), accept)]
    assert all(fixed < 0.5 * twice for fixed, twice in zip(errors[True], errors[False])), errors
