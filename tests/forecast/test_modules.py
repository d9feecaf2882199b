"""granularity="module" (TaylorSeer-faithful submodule forecasts) and the max_cache_gb budget."""

import math

import pytest
import torch

from diffspec.bench.counting import ComputeCounter
from diffspec.config import ForecastConfig, SpecaConfig
from diffspec.forecast.blocks import find_block_lists
from diffspec.forecast.budget import choose_cache
from diffspec.forecast.gate import Schedule
from diffspec.forecast.hooks import ForecastHooks
from diffspec.forecast.taylor import TaylorForecaster
from diffspec.stats import SpecStats
from diffspec.testing.random_transformers import build_transformer, make_call, timesteps_for

MODULE_MODELS = ["tiny-dit-random", "tiny-pixart", "tiny-sd3", "tiny-flux-random"]
STEPS = 16


def _run(name, config, batch=2, steps=STEPS, model=None):
    model = model if model is not None else build_transformer(name)
    x, call = make_call(name, batch=batch)
    stats = SpecStats()
    hooks = ForecastHooks(model, config, stats, num_steps_fn=lambda: steps) if config is not None else None
    if hooks:
        hooks.attach()
    with torch.no_grad():
        for t in timesteps_for(name, steps):
            x = x - 0.05 * call(model, x, t)
    if hooks:
        hooks.detach()
    return x, stats


@pytest.mark.parametrize("name", MODULE_MODELS)
def test_module_forecast_steps_run_only_gates_and_stay_close(name):
    model = build_transformer(name)
    cfg = ForecastConfig(granularity="module")
    hooks = ForecastHooks(model, cfg, SpecStats(), num_steps_fn=lambda: STEPS)
    hooks.attach()
    x, call = make_call(name, batch=2)
    with torch.no_grad(), ComputeCounter(model) as counter:
        for t in timesteps_for(name, STEPS):
            x = x - 0.05 * call(model, x, t)
    hooks.detach()
    full = max(counter.per_call)
    expected = Schedule.of(cfg).without_rejections(STEPS)
    assert [u == full for u in counter.per_call] == expected
    assert max(u for u, f in zip(counter.per_call, expected) if not f) < 0.15 * full  # adaLN gates only

    heavy = {"n": 0}
    for _, blocks in find_block_lists(model):
        for block in blocks:
            for sub_name in ("attn", "attn1", "attn2", "ff", "ff_context", "proj_mlp", "proj_out"):
                sub = getattr(block, sub_name, None)
                for lin in sub.modules() if sub is not None else ():
                    if isinstance(lin, torch.nn.Linear):
                        lin.register_forward_pre_hook(lambda *_: heavy.__setitem__("n", heavy["n"] + 1))
    hooks.attach()
    hooks.reset()
    x2, call = make_call(name, batch=2)
    with torch.no_grad():
        for i, t in enumerate(timesteps_for(name, STEPS)):
            before = heavy["n"]
            x2 = x2 - 0.05 * call(model, x2, t)
            assert (heavy["n"] > before) == expected[i]  # no attention / MLP linear runs on a forecast step
    hooks.detach()
    assert torch.equal(x2, x)

    baseline, _ = _run(name, None)
    block, _ = _run(name, ForecastConfig())
    rel = (x - baseline).norm() / baseline.norm()
    assert torch.isfinite(x).all() and 0 < rel < 0.2, rel
    assert not torch.equal(x, block)  # a different forecast than the block granularity's
    assert torch.equal(_run(name, None, model=model)[0], baseline)  # detach restores


@pytest.mark.parametrize("name", MODULE_MODELS)
def test_module_interval_one_is_bit_identical(name):
    baseline, _ = _run(name, None)
    out, _ = _run(name, ForecastConfig(granularity="module", interval=1))
    assert torch.equal(out, baseline)


@pytest.mark.parametrize("name", ["tiny-dit-random", "tiny-flux-random"])
def test_speca_module_boundary_oracles(name):
    baseline, _ = _run(name, None)
    strict, stats = _run(name, SpecaConfig(granularity="module", tau0=0.0, beta=1.0, tau_min=0.0, k_min=0))
    assert torch.equal(strict, baseline) and stats.forecast_steps == 0 and stats.extra["rejections"] > 0
    taylor, _ = _run(name, ForecastConfig(granularity="module", interval=4, order=2))
    speca, s_stats = _run(name, SpecaConfig(granularity="module", tau0=math.inf, k_max=4, order=2))
    assert torch.equal(speca, taylor) and s_stats.forecast_steps > 0


def test_speca_module_accepts_and_commits_the_true_last_block():
    cfg = SpecaConfig(granularity="module", tau0=1e9, beta=1.0, tau_min=1e9, k_min=0, k_max=4, order=2)
    out, stats = _run("tiny-dit-random", cfg)
    taylor, _ = _run("tiny-dit-random", ForecastConfig(granularity="module", interval=4, order=2))
    baseline, _ = _run("tiny-dit-random", None)
    assert stats.extra["rejections"] == 0 and stats.extra["checks"] == 2 * stats.forecast_steps > 0  # 2 rows
    assert not torch.equal(out, taylor)
    assert (out - baseline).norm() < (taylor - baseline).norm() * 1.5


def test_module_holds_more_memory_than_block_and_reports_it():
    _, block = _run("tiny-dit-random", ForecastConfig())
    _, module = _run("tiny-dit-random", ForecastConfig(granularity="module"))
    assert 0 < block.extra_mem_gb < module.extra_mem_gb


def test_module_on_unsupported_blocks_is_a_clear_error():
    with pytest.raises(ValueError, match="granularity='module' is not supported for WanTransformerBlock"):
        ForecastHooks(build_transformer("tiny-wan"), ForecastConfig(granularity="module"), SpecStats())


def test_auto_falls_back_to_block_where_modules_are_unsupported():
    _, stats = _run("tiny-wan", ForecastConfig(granularity="auto"))
    assert stats.extra["granularity"] == "block" and stats.forecast_steps > 0


def test_budget_picks_granularity_then_order():
    _, roomy = _run("tiny-dit-random", ForecastConfig(granularity="auto", order=2, max_cache_gb=10.0))
    assert (roomy.extra["granularity"], roomy.extra["order"]) == ("module", 2)
    level = roomy.extra["cache_level_gb"]
    assert level["module"] > level["block"] > 0
    between = (3 * level["block"] + 3 * level["module"]) / 2  # block fits at order 2, module does not
    _, mid = _run("tiny-dit-random", ForecastConfig(granularity="auto", order=2, max_cache_gb=between))
    assert (mid.extra["granularity"], mid.extra["order"]) == ("block", 2)
    _, tight = _run("tiny-dit-random", ForecastConfig(granularity="block", order=2, max_cache_gb=level["block"] * 1.5))
    assert (tight.extra["granularity"], tight.extra["order"]) == ("block", 0)
    with pytest.warns(UserWarning, match="using it anyway"):
        _run("tiny-dit-random", ForecastConfig(order=1, max_cache_gb=1e-12))


def test_budgeted_run_equals_the_run_configured_that_way():
    picked, _ = _run("tiny-dit-random", ForecastConfig(granularity="auto", order=2, max_cache_gb=10.0))
    direct, _ = _run("tiny-dit-random", ForecastConfig(granularity="module", order=2))
    assert torch.equal(picked, direct)


def test_choose_cache_and_set_order():
    assert choose_cache("auto", 1, None, {}, True) == ("module", 1)
    assert choose_cache("auto", 1, None, {}, False) == ("block", 1)
    assert choose_cache("module", 2, 1.0, {"module": 4e8}, True) == ("module", 1)
    f = TaylorForecaster(order=3)
    f.update(0.0, torch.ones(2))
    f.set_order(1)
    f.update(1.0, 2 * torch.ones(2))
    assert torch.equal(f.forecast(2.0), torch.full((2,), 3.0))
    f.update(2.0, 3 * torch.ones(2))
    with pytest.raises(ValueError, match="more anchors"):
        f.set_order(0)


@pytest.mark.parametrize("field,value,match", [("granularity", "layer", "granularity='layer'"),
                                               ("max_cache_gb", 0.0, r"max_cache_gb=0.0 is out of range")])
def test_config_validation(field, value, match):
    with pytest.raises(ValueError, match=match):
        ForecastConfig(**{field: value})
    with pytest.raises(ValueError, match=match):
        SpecaConfig(**{field: value})


def test_module_granularity_under_whole_model_compile_matches_eager():
    import torch._dynamo

    eager, _ = _run("tiny-dit-random", ForecastConfig(granularity="module"))
    compiled = torch.compile(build_transformer("tiny-dit-random"), backend="eager")
    torch._dynamo.utils.counters.clear()
    out, stats = _run("tiny-dit-random", ForecastConfig(granularity="module"), model=compiled)
    assert torch.equal(out, eager) and stats.forecast_steps > 0
    assert not torch._dynamo.utils.counters["graph_break"]
