"""The equal-budget mode of the dit-cache suite: search, selection rule and honest counting."""

import pytest

from diffspec.bench import equal_evals, run_bench
from diffspec.bench.equal_evals import CALIBRATION_SEED0, EQUAL_METHODS, candidate_grid, select
from diffspec.config import SpecaConfig
from diffspec.forecast.gate import Schedule


def test_select_keeps_the_best_calibration_psnr_within_the_budget():
    search = [{"evals": 12.0, "psnr": 30.0}, {"evals": 13.0, "psnr": 29.0}, {"evals": 14.0, "psnr": 45.0},
              {"evals": 10.0, "psnr": 30.0}]
    assert select(search, 13.0) == {"evals": 12.0, "psnr": 30.0, "over_budget": False}  # tie: more evals
    assert select(search, 14.0)["psnr"] == 45.0
    over = select(search, 9.0)  # nothing fits: the cheapest, flagged
    assert over["evals"] == 10.0 and over["over_budget"]
    with pytest.raises(ValueError):
        select([], 5.0)


def test_grids_cover_every_method_and_the_budgets():
    for method in EQUAL_METHODS:
        assert candidate_grid(method, [13.0], {"tau0": 0.01, "beta": 0.1, "tau_min": 0.0}, [0.5] * 50)
    assert {c["num_inference_steps"] for c in candidate_grid("fewer-steps", [13.0, 20.0])} == {11, 12, 13, 18, 19, 20}
    spread = [c for c in candidate_grid("taylor", [13.0, 20.0]) if "full_steps" in c]  # the even grid at any count
    assert {c["full_steps"] for c in spread} == {11, 12, 13, 18, 19, 20} and len(spread) == 24
    speca = candidate_grid("speca", [13.0], {"tau0": 0.01, "beta": 0.1, "tau_min": 0.001})
    assert {c["tau0"] for c in speca} == {0.03, 0.1, 0.3}  # scaled from the calibrated value
    assert {c["granularity"] for c in speca} == {"block", "module"} and {c["warmup"] for c in speca} == {2, 3}
    assert all(c["k_max"] - 3 <= c["k_min"] <= c["k_max"] - 2 for c in speca)  # one or two checks per interval
    assert {c["beta"] for c in speca} == {0.1, 1.0}
    with pytest.raises(ValueError, match="unknown method"):
        candidate_grid("nope", [13.0])


def test_speca_grid_reaches_small_budgets():
    """Some ``speca`` setting plans at most 11 evaluations of a 5-block model over 50 steps, counting a
    last-block check per checked draft (the committed search once bottomed out at 15)."""
    def planned(knobs):
        cfg = SpecaConfig(**knobs)
        full = Schedule.of(cfg).without_rejections(50).count(True)
        return full + (full - cfg.warmup) * (cfg.k_max - 1 - cfg.k_min) / 5

    assert min(planned(c) for c in candidate_grid("speca", [13.0])) <= 11.0


def _small_grid(monkeypatch):
    full = equal_evals.candidate_grid

    def grid(method, budgets, *rest):
        g = full(method, budgets, *rest)
        return g if method == "fewer-steps" else g[::7]  # every seventh setting keeps the test fast

    monkeypatch.setattr(equal_evals, "candidate_grid", grid)


def test_equal_budget_run_keeps_arms_within_the_budget_and_records_the_search(monkeypatch):
    _small_grid(monkeypatch)
    methods = ["taylor", "diffusers-taylorseer", "fewer-steps"]
    doc = run_bench("dit-cache", model="tiny-dit", methods=methods, budget_evals=[5.0], steps=10, batch=2, repeats=1,
                    warmup=0, quality_samples=2, show_progress=False)
    eq = doc["equal_evals"]
    seeds = eq["calibration_seeds"]
    assert seeds[0] == CALIBRATION_SEED0 and not set(seeds) & set(doc["workload"]["seeds"])
    assert not set(seeds) & set(range(1000, 1002))  # nor the quality seeds
    runs = {r["method"]: r for r in doc["runs"]}
    assert list(runs) == ["baseline", *methods] and "wall_clock_caveat" in doc
    for m in methods:
        run, search = runs[m], eq["search"][m]
        assert run["budget_evals"] == 5.0 and run["peer"] == (m != "taylor")
        fits = [e for e in search if e["evals"] <= 5.0]
        assert fits, m
        assert run["selection"]["calibration_psnr"] == max(e["psnr"] for e in fits)  # the rule, not just any
        assert run["selection"]["knobs"] in [e["knobs"] for e in fits]
        assert run["target_evals"] <= 5.0 + 0.5 and not run["quality"]["exact"]
    assert runs["fewer-steps"]["target_evals"] == runs["fewer-steps"]["selection"]["knobs"]["num_inference_steps"]
    # honest counting of diffusers' TaylorSeer: with attention alone cached, the MLPs still count on draft steps
    ts = eq["search"]["diffusers-taylorseer"]
    attention_only = [e for e in ts if e["knobs"]["cache"] == "attention"]
    assert attention_only and all(e["evals"] > e["target_calls"] for e in attention_only)


def test_bad_budget_or_method_is_a_value_error():
    with pytest.raises(ValueError, match="budget_evals"):
        run_bench("dit-cache", model="tiny-dit-random", methods=["taylor"], budget_evals=[99.0], steps=6,
                  repeats=1, warmup=0, show_progress=False)
    with pytest.raises(ValueError, match="no equal-budget search"):
        run_bench("dit-cache", model="tiny-dit-random", methods=["diffusers-taylorseer-tuned"], budget_evals=[3.0],
                  steps=6, repeats=1, warmup=0, show_progress=False)


def test_cache_dit_overrides_are_applied_and_checked():
    pytest.importorskip("cache_dit")
    from diffspec.bench.cache_dit_peer import CacheDitCache
    from diffspec.testing.random_transformers import build_transformer

    model = build_transformer("tiny-dit-random")
    cache = CacheDitCache(model, "cache-dit-dbcache-taylorseer", 10,
                          overrides={"residual_diff_threshold": 0.3, "max_warmup_steps": 2, "taylorseer_order": 2})
    assert cache.cache_config.residual_diff_threshold == 0.3 and cache.cache_config.max_warmup_steps == 2
    assert cache.calibrator_config.taylorseer_order == 2 and "max_warmup_steps" in cache.changed
    with pytest.raises(ValueError, match="no setting"):
        CacheDitCache(model, "cache-dit-dbcache", 10, overrides={"taylorseer_order": 2})


def test_taylorseer_peer_can_forecast_every_heavy_submodule_of_flux():
    """diffusers' TaylorSeer at its cheapest on FLUX: the feed-forward patterns cover the text-stream
    ``ff_context`` and the single blocks' fused MLP, and its lite mode is offered where there is a ``proj_out``."""
    import re

    from diffspec.testing.random_transformers import build_transformer

    flux = build_transformer("tiny-flux-random")
    names = [n for n, _ in flux.named_modules()]
    cached = {n.split(".", 2)[-1] for n in names if any(re.fullmatch(p, n) for p in equal_evals.ATTENTION_FF_IDENTIFIERS)}
    assert {"attn", "ff", "ff_context", "proj_mlp", "proj_out"} <= cached
    assert equal_evals.has_lite_mode(flux) and not equal_evals.has_lite_mode(build_transformer("tiny-dit-random"))
    assert {c["cache"] for c in candidate_grid("diffusers-taylorseer", [13.0], lite=True)} == {
        "attention", "attention+ff", "lite"}
    assert "lite" not in {c["cache"] for c in candidate_grid("diffusers-taylorseer", [13.0])}


def test_speca_replay_on_random_weights_replays_the_trained_calibration_or_is_skipped(monkeypatch):
    _small_grid(monkeypatch)
    kw = dict(model="tiny-dit-random", methods=["taylor", "speca-replay"], budget_evals=[13.0], repeats=1, warmup=0,
              quality_samples=2, show_progress=False)
    doc = run_bench("dit-cache", steps=50, batch=1, **kw)  # the trained tiny-dit's record is for 50 steps
    assert "trained tiny-dit" in doc["equal_evals"]["speca_replay_record"]
    assert [r["method"] for r in doc["runs"]] == ["baseline", "taylor", "speca-replay"] and "skipped" not in doc
    doc = run_bench("dit-cache", steps=20, batch=1, **kw)  # no record for 20 steps: listed, not an error
    assert [r["method"] for r in doc["runs"]] == ["baseline", "taylor"]
    assert doc["skipped"][0]["method"] == "speca-replay" and "20 steps" in doc["skipped"][0]["reason"]
