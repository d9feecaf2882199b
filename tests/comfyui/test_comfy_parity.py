"""The ComfyUI adapter and the diffusers adapter give the same samples on the same blocks and inputs.

One set of toy Flux weights runs (a) as a ComfyUI diffusion model patched by the nodes
(block-replace patches + wrappers, driven by a CFGGuider-shaped sampler) and (b) as a
diffusers-style transformer under :class:`~diffspec.forecast.hooks.ForecastHooks`, with the same
sigmas, CFG rows and Euler updates. Both share ``TaylorForecaster`` / ``Schedule`` / ``verify_error``.
"""

import pytest
import torch
from comfy_fakes import DiffusersToy, euler_cfg, make_inputs, sample, toy_patcher

from diffspec.comfyui import apply_forecast, forecast_of
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.profiles import BLOCKS, BlockProfile
from diffspec.stats import SpecStats

STEPS = 16
COUNTERS = ("full_steps", "forecast_steps", "target_calls", "draft_calls", "accepted", "proposed")


@pytest.fixture(autouse=True)
def _flux_like_layout(monkeypatch):
    monkeypatch.setitem(BLOCKS, "DiffusersDouble", BlockProfile("DiffusersDouble", (1, 0)))  # returns (encoder, hidden)
    monkeypatch.setitem(BLOCKS, "DiffusersSingle", BlockProfile("DiffusersSingle", (0, None)))  # (a tensor; spares a diffusers import)


def _diffusers_run(patcher, config, x0, sigmas, contexts):
    toy = DiffusersToy(patcher.model.diffusion_model)
    config = config.replace(blocks=("transformer_blocks", "single_transformer_blocks"))
    stats = SpecStats(method=config.method)
    hooks = ForecastHooks(toy, config, stats, num_steps_fn=lambda: len(sigmas) - 1)
    hooks.attach()
    try:
        out = euler_cfg(lambda x, t, c: toy(hidden_states=x, encoder_hidden_states=c, timestep=t), x0, sigmas, contexts)
    finally:
        hooks.detach()
    return out, stats


def _comfy_run(patcher, config, x0, sigmas, contexts):
    patched = apply_forecast(patcher, config)
    out = sample(patched, x0, sigmas, contexts)
    return out, forecast_of(patched).stats


def test_unpatched_models_agree():
    patcher = toy_patcher()
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    toy = DiffusersToy(patcher.model.diffusion_model)
    ours = euler_cfg(lambda x, t, c: toy(hidden_states=x, encoder_hidden_states=c, timestep=t), x0, sigmas, contexts)
    torch.testing.assert_close(sample(patcher, x0, sigmas, contexts), ours, rtol=0, atol=0)


@pytest.mark.parametrize("config", [
    ForecastConfig(),
    ForecastConfig(order=2, interval=4, warmup=2, abscissa="index"),
    ForecastConfig(order=2, form="taylor", interval=3, last_step_full=False),
], ids=["default", "order2-index", "taylor-form"])
def test_taylor_matches_diffusers_path(config):
    patcher = toy_patcher()
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    comfy, c_stats = _comfy_run(patcher, config, x0, sigmas, contexts)
    diffusers, d_stats = _diffusers_run(patcher, config, x0, sigmas, contexts)
    torch.testing.assert_close(comfy, diffusers, rtol=1e-5, atol=1e-6)
    assert {k: getattr(c_stats, k) for k in COUNTERS} == {k: getattr(d_stats, k) for k in COUNTERS}
    assert c_stats.forecast_steps > 0


@pytest.mark.parametrize("config", [
    SpecaConfig(tau0=0.1, beta=0.3, tau_min=0.02, k_min=1),
    SpecaConfig(tau0=0.6, beta=0.5, tau_min=0.1, k_min=0, k_max=6, metric="rel_res"),
    SpecaConfig(tau0=0.05, beta=0.5, tau_min=0.01, k_min=0, policy="lazy", order=2),
], ids=["strict", "rel_res", "lazy-order2"])
def test_speca_matches_diffusers_path(config):
    patcher = toy_patcher()
    x0, sigmas, contexts = make_inputs(steps=STEPS)
    comfy, c_stats = _comfy_run(patcher, config, x0, sigmas, contexts)
    diffusers, d_stats = _diffusers_run(patcher, config, x0, sigmas, contexts)
    torch.testing.assert_close(comfy, diffusers, rtol=1e-5, atol=1e-6)
    assert {k: getattr(c_stats, k) for k in COUNTERS} == {k: getattr(d_stats, k) for k in COUNTERS}
    for key in ("checks", "rejections"):
        assert c_stats.extra.get(key) == d_stats.extra.get(key)
    assert c_stats.extra["checks"] > 0 and c_stats.forecast_steps > 0


def test_speca_rows_diverge_and_still_match(monkeypatch):
    """cond and uncond rows take different decisions (one row recomputed, the other's draft kept)."""
    import diffspec.comfyui.forecast as comfy_forecast

    merged = []
    real_merge = comfy_forecast.merge_rows

    def spy(index, part, whole):
        merged.append((len(index), whole.shape[0]))
        return real_merge(index, part, whole)

    monkeypatch.setattr(comfy_forecast, "merge_rows", spy)
    patcher = toy_patcher(seed=3)
    x0, sigmas, contexts = make_inputs(seed=5, steps=STEPS)
    contexts = [8 * contexts[0], contexts[1]]
    config = SpecaConfig(tau0=0.03, beta=1.0, tau_min=0.03, k_min=0, k_max=8)
    comfy, c_stats = _comfy_run(patcher, config, x0, sigmas, contexts)
    diffusers, d_stats = _diffusers_run(patcher, config, x0, sigmas, contexts)
    assert 0 < c_stats.extra["rejections"] < c_stats.extra["checks"]
    assert any(n < batch for n, batch in merged)  # some call committed full rows next to drafted ones
    assert c_stats.accepted not in (0, c_stats.proposed) and c_stats.proposed % 2 == 0
    torch.testing.assert_close(comfy, diffusers, rtol=1e-5, atol=1e-6)
    assert {k: getattr(c_stats, k) for k in COUNTERS} == {k: getattr(d_stats, k) for k in COUNTERS}
