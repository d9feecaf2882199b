"""speca: verifier-gated forecasting. Boundary oracles, per-row decisions, fallbacks."""

import math

import pytest
import torch

import diffspec.forecast.blocks as blocks_module
import diffspec.forecast.hooks as hooks_module
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.gate import Schedule
from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.taylor import TaylorForecaster
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import TINY_MODELS, build_transformer, make_call, timesteps_for

MODELS = list(TINY_MODELS)
STEPS = 16


def _run(name, config, x0=None, batch=1, steps=STEPS):
    model = build_transformer(name)
    x, call = make_call(name, batch=batch)
    x = x if x0 is None else x0
    stats = SpecStats(method="speca")
    hooks = ForecastHooks(model, config, stats, num_steps_fn=lambda: steps) if config is not None else None
    if hooks:
        hooks.attach()
    with torch.no_grad():
        for t in timesteps_for(name, steps):
            x = x - 0.05 * call(model, x, t)
    return x, stats


@pytest.mark.parametrize("name", MODELS)
def test_tau_zero_strict_is_bit_identical_to_the_baseline(name):
    baseline, _ = _run(name, None, batch=2)
    out, stats = _run(name, SpecaConfig(tau0=0.0, beta=1.0, tau_min=0.0, k_min=0), batch=2)
    assert torch.equal(out, baseline)
    drafts = STEPS - 3 - 1  # every step between warmup and the last is drafted, checked and rejected
    assert stats.extra["checks"] == stats.extra["rejections"] == 2 * drafts
    assert stats.accepted == 0 and stats.forecast_steps == 0 and stats.target_calls == STEPS


@pytest.mark.parametrize("name", MODELS)
def test_tau_inf_equals_taylor_at_interval_k_max(name):
    taylor, t_stats = _run(name, ForecastConfig(order=2, interval=4, warmup=2), batch=2)
    speca, s_stats = _run(name, SpecaConfig(tau0=math.inf, k_max=4, warmup=2, order=2), batch=2)
    assert torch.equal(speca, taylor)
    assert s_stats.full_steps == t_stats.full_steps and s_stats.forecast_steps == t_stats.forecast_steps
    assert "checks" not in s_stats.extra


@pytest.mark.parametrize("name", ["tiny-dit-random", "tiny-hunyuandit"])  # HunyuanDiT: long skip into the last block
def test_accepted_drafts_commit_the_verified_block(name):
    """Accept everything: same schedule as taylor, but the last block ran on each checked draft."""
    taylor, _ = _run(name, ForecastConfig(order=2, interval=4))
    speca, stats = _run(name, SpecaConfig(tau0=1e9, beta=1.0, tau_min=1e9, k_max=4, k_min=0, order=2))
    baseline, _ = _run(name, None)
    assert stats.extra["rejections"] == 0 and stats.extra["checks"] == stats.forecast_steps
    assert stats.extra["verifier_blocks"] == stats.forecast_steps
    assert stats.full_steps == sum(Schedule(3, 4).without_rejections(STEPS))
    assert not torch.equal(speca, taylor)
    assert (speca - baseline).norm() < (taylor - baseline).norm()


def test_rows_decide_independently_of_their_batch():
    """Row 0 (and row 1) get the same output whatever row shares the batch, though rows decide differently."""
    name = "tiny-flux-random"
    model = build_transformer(name)
    x, call = make_call(name, batch=2, seed=3)  # conditioning is fixed per row position
    cfg = SpecaConfig(tau0=0.02, beta=0.5, tau_min=0.005, k_min=0, k_max=6)

    def run(x):
        stats = SpecStats()
        hooks = ForecastHooks(model, cfg, stats, num_steps_fn=lambda: STEPS)
        full_rows = []
        count = hooks._count
        hooks._count = lambda recompute, evals: (full_rows.append(recompute), count(recompute, evals))
        hooks.attach()
        with torch.no_grad():
            for t in timesteps_for(name, STEPS):
                x = x - 0.05 * call(model, x, t)
        hooks.detach()
        return x, [sum(r[i] for r in full_rows) for i in range(2)]

    mixed, full_per_row = run(torch.cat([x[:1], 4 * x[1:]]))
    assert full_per_row[0] != full_per_row[1]  # the rows really took different paths
    row0_other_neighbour, _ = run(x)
    row1_other_neighbour, _ = run(4 * x)
    torch.testing.assert_close(mixed[0], row0_other_neighbour[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mixed[1], row1_other_neighbour[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS[4:])
def test_verifier_on_a_subset_of_rows_keeps_rows_independent(name, monkeypatch, scale_row_errors):
    """Row 1's checks always fail, row 0's always pass: the verifier and the recomputations then run on row
    subsets (sliced arguments, per-row lists, stacked tensors). Row 0 must get the output it gets when every
    row passes, row 1 the plain run's output (it is recomputed in full at every step)."""
    x, _ = make_call(name, batch=2, seed=3)
    other, _ = make_call(name, batch=2, seed=11)  # other noise for row 1 (conditioning stays per row position)
    x = torch.cat([x[:1], other[1:]])
    cfg = SpecaConfig(tau0=1e6, beta=1.0, tau_min=1e6, k_min=0, k_max=4)
    subsets = []
    take_call_rows = hooks_module.take_call_rows

    def spy(*args, **kwargs):
        subsets.append(args[3].tolist())
        return take_call_rows(*args, **kwargs)

    def run(row_error_scale=None):
        scale_row_errors(row_error_scale)
        monkeypatch.setattr(hooks_module, "take_call_rows", spy)  # the recompute
        monkeypatch.setattr(blocks_module, "take_call_rows", spy)  # the verifier
        out, stats = _run(name, cfg, x0=x, batch=2)
        return out, stats

    split, stats = run([1.0, 1e12])
    assert subsets and all(rows == [1] or rows == [0] for rows in subsets)  # the sub-batch paths really ran
    assert stats.extra["rejections"] > 0 and stats.accepted > 0
    all_pass, _ = run()
    baseline, _ = _run(name, None, x0=x, batch=2)
    torch.testing.assert_close(split[0], all_pass[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(split[1], baseline[1], rtol=1e-4, atol=1e-5)


def test_non_finite_draft_falls_back_to_full_compute(monkeypatch):
    baseline, _ = _run("tiny-dit-random", None)
    real = TaylorForecaster.forecast

    def poisoned(self, x):
        return real(self, x) * float("nan")

    monkeypatch.setattr(TaylorForecaster, "forecast", poisoned)
    cfg = SpecaConfig(tau0=1e9, beta=1.0, tau_min=1e9, k_min=5)  # huge tau: only a non-finite draft fails
    out, stats = _run("tiny-dit-random", cfg)
    assert torch.equal(out, baseline) and stats.target_calls == STEPS and stats.accepted == 0


def test_lazy_keeps_the_rejected_draft_and_makes_the_next_step_full():
    strict, s_stats = _run("tiny-dit-random", SpecaConfig(tau0=0.0, beta=1.0, tau_min=0.0, k_min=0))
    lazy, l_stats = _run("tiny-dit-random", SpecaConfig(tau0=0.0, beta=1.0, tau_min=0.0, k_min=0, policy="lazy"))
    assert not torch.equal(lazy, strict)
    # warmup 3 full, then draft (rejected) / full alternating, last step full
    assert l_stats.forecast_steps == l_stats.extra["rejections"] > 0
    assert l_stats.full_steps + l_stats.forecast_steps == STEPS


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="k_max=0"):
        SpecaConfig(k_max=0)
    with pytest.raises(ValueError, match="beta=150"):
        SpecaConfig(beta=150.0)
    with pytest.raises(ValueError, match="policy='eager'"):
        SpecaConfig(policy="eager")
    assert SpecaConfig().tau(0.0) == pytest.approx(0.1) and SpecaConfig(tau0=math.inf).tau(1.0) == math.inf
