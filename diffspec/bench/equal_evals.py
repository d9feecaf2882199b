"""Equal-budget mode of the ``dit-cache`` suite: every arm tuned to the same number of full evaluations.

Each arm with a knob (our ``taylor`` / ``speca``, diffusers' TaylorSeer, FirstBlockCache and
MagCache, cache-dit's DBCache with and without its TaylorSeer calibrator, and the fewer-steps run)
gets a small grid of settings (:func:`candidate_grid`). Every candidate runs once on *calibration
seeds*, which are neither the timed seeds nor the quality seeds, with the compute counter of
:mod:`diffspec.bench.counting` (the same counting for every arm: block ``nn.Linear`` work in
full-call equivalents). For a budget ``B`` the setting kept is the one with the best calibration
PSNR among those whose measured evaluations per generation are at most ``B``
(:func:`select`); an arm that cannot get under ``B`` keeps its cheapest setting and is marked
``"over_budget"``. All kept settings then run side by side through :func:`~diffspec.bench.runner.run_arms`
(counting on the timed seeds, interleaved timing, quality on the quality seeds vs the same-seed
full run), and the whole search is written to the JSON.

Example:
    >>> doc = run_bench("dit-cache", model="tiny-dit", budget_evals=[13.0], quality_samples=100)  # doctest: +SKIP
    >>> [(r["method"], r["target_evals"], r["quality"]["psnr"]) for r in doc["runs"]]  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from ..config import FALLBACK_TAU, ForecastConfig, SpecaConfig
from ..forecast.calibrate import replay_schedule
from ..metrics import psnr
from ..progress import progress
from .cache_dit_peer import CACHE_DIT_PEERS
from .peers import calibrate_magcache, taylorseer_identifiers
from .runner import run_arms
from .timing import Arm
from .workload import Workload, count_compute

CALIBRATION_SEED0 = 100_000
"""Calibration seeds start here: disjoint from the timed seeds (0..batch) and the quality seeds (1000..)."""

EQUAL_METHODS = ("taylor", "speca", "speca-replay", "diffusers-taylorseer", "diffusers-fbc", "diffusers-magcache",
                 *CACHE_DIT_PEERS, "fewer-steps")
"""The arms of the equal-budget mode (diffusers' TaylorSeer has one arm: its knobs are searched)."""

SPECA_RUNS = ((4, 2), (5, 3), (5, 2), (6, 4), (6, 3), (8, 6), (8, 5))
"""``speca``'s ``(k_max, k_min)`` pairs searched: one or two checked drafts before the forced full step
(each check runs the last block, ``1 / num_blocks`` of a call, so more checks rarely pay at small budgets)."""

SPECA_TAU_SCALES = ((3.0, None), (10.0, 1.0), (30.0, 1.0))
"""``speca``'s thresholds searched: ``(s, beta)`` scales ``tau0`` and ``tau_min`` by ``s``; ``beta`` None keeps the
calibrated one. Calibration targets one quality at one schedule; the budgets need looser thresholds.
``abscissa`` is not searched (nor for ``taylor``): the Newton forecast does not change under an affine map of the
abscissa, so on evenly spaced timesteps (the ``tiny-dit``'s DDIM schedule) ``"index"`` and ``"sigma"`` agree."""

ATTENTION_FF_IDENTIFIERS = [r"^[^.]*blocks\.\d+\.(attn\d*|ff|ffn|ff_context|proj_mlp|proj_out)$"]
"""diffusers TaylorSeer ``cache_identifiers`` forecasting the feed-forwards too (its default caches
attention only, so its draft steps still run every MLP and cannot reach small budgets): ``ff`` (DiT, PixArt,
SD3, FLUX double blocks...), ``ffn`` (Wan), ``ff_context`` (the text stream of SD3 / FLUX / HunyuanVideo
double blocks) and ``proj_mlp`` / ``proj_out`` (the fused MLP of FLUX / HunyuanVideo single blocks)."""


def has_lite_mode(transformer: torch.nn.Module) -> bool:
    """Whether diffusers TaylorSeer's lite mode has something to forecast here: a top-level ``proj_out``
    (DiT's output layers are ``proj_out_1`` / ``proj_out_2``, so there it would only zero the blocks)."""
    return isinstance(getattr(transformer, "proj_out", None), torch.nn.Module)


def candidate_grid(method: str, budgets: list[float], speca_thresholds: dict[str, float] | None = None,
                   full_rate: list[float] | None = None, schedules: list[dict[str, Any]] | None = None,
                   lite: bool = False) -> list[dict[str, Any]]:
    """The settings searched for ``method``: knob dicts, each a few values per knob.

    ``speca_thresholds``: the calibrated ``tau0`` / ``beta`` / ``tau_min``; candidates scale ``tau0``.
    ``full_rate``: per step, how often the calibrated gate ran the step in full on the calibration
    record's seeds; ``speca-replay`` replays its top ``n`` steps (no verifier) for ``n`` near each budget.
    ``schedules``: the record's searched placements (``diffspec calibrate --schedules``), also replayed.
    ``lite``: also offer diffusers TaylorSeer's lite mode (every block skipped, the model's top-level
    ``proj_out`` forecast), for transformers that have one (:func:`has_lite_mode`).

    Example:
        >>> len(candidate_grid("diffusers-fbc", [13.0]))
        7
    """
    ns = sorted({n for b in budgets for n in (int(b) - 2, int(b) - 1, int(b)) if n >= 1})  # full steps near a budget
    if method == "taylor":
        intervals = [{"granularity": g, "order": o, "interval": i, "warmup": w}
                     for g, o, i, w in itertools.product(("block", "module"), (1, 2), (3, 4, 5, 6), (2, 3))]
        spread = [{"granularity": g, "order": o, "full_steps": n, "warmup": 2}
                  for g, o, n in itertools.product(("block", "module"), (1, 2), ns) if n > 2]
        return intervals + spread
    if method == "speca":
        t = {**FALLBACK_TAU, **(speca_thresholds or {})}
        taus = [{"tau0": round(t["tau0"] * s, 8), "beta": t["beta"] if b is None else b, "tau_min": t["tau_min"] * s}
                for s, b in SPECA_TAU_SCALES]
        block = [{"granularity": "block", "warmup": w, "order": o, "k_max": k, "k_min": m, **tau}
                 for w, o, (k, m), tau in itertools.product((2, 3), (1, 2), SPECA_RUNS, taus)]
        module = [{"granularity": "module", "warmup": 2, "order": 2, "k_max": k, "k_min": m, **tau}
                  for (k, m), tau in itertools.product(SPECA_RUNS, taus)]
        return block + module
    if method == "speca-replay":
        if not full_rate:
            raise ValueError("equal-evals: speca-replay needs the calibration record's full_rate "
                             "(rerun `diffspec calibrate` on this model)")
        thinned = [{"granularity": g, "order": o, "replay_steps": replay_schedule(full_rate, n)}
                   for g, o, n in itertools.product(("block", "module"), (1, 2), ns) if n <= len(full_rate)]
        searched = [{"granularity": e["granularity"], "order": e["order"], "replay_steps": tuple(e["schedule"])}
                    for e in schedules or []]
        return thinned + searched
    if method == "diffusers-taylorseer":
        caches = ("attention", "attention+ff", "lite") if lite else ("attention", "attention+ff")
        return [{"cache": c, "cache_interval": i, "max_order": o, "disable_cache_before_step": w}
                for c, i, o, w in itertools.product(caches, (3, 4, 5, 6), (1, 2), (2, 3))]
    if method == "diffusers-fbc":
        return [{"threshold": t} for t in (0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2)]
    if method == "diffusers-magcache":
        return [{"threshold": t, "max_skip_steps": k}
                for t, k in itertools.product((0.06, 0.12, 0.24, 0.5, 1.0), (3, 5, 8))]
    if method in CACHE_DIT_PEERS:
        grid = [{"residual_diff_threshold": t, "max_warmup_steps": w}
                for t, w in itertools.product((0.08, 0.16, 0.3, 0.6), (2, 4, 8))]
        if method == "cache-dit-dbcache-taylorseer":
            grid = [{**g, "taylorseer_order": o} for g in grid for o in (1, 2)]
        return grid
    if method == "fewer-steps":
        return [{"num_inference_steps": k} for k in ns]
    raise ValueError(f"equal-evals: unknown method {method!r}; choose from {', '.join(EQUAL_METHODS)}")


def build_arm(workload: Workload, method: str, knobs: dict[str, Any], magcache_ratios: list[float] | None = None,
              name: str | None = None) -> Arm:
    """The arm of ``method`` at ``knobs`` (one entry of :func:`candidate_grid`), named ``name``."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    from .dit_cache import cache_dit_arm, diffusers_arm

    name = name or method
    if method == "taylor":
        arm = workload.method_arm(method, ForecastConfig().replace(**knobs))
    elif method in ("speca", "speca-replay"):
        arm = workload.method_arm("speca", SpecaConfig().replace(**knobs))
    elif method == "fewer-steps":
        k = knobs["num_inference_steps"]
        arm = Arm(name, lambda seeds: workload.generate(seeds, steps=k), peer=True, config=dict(knobs))
    elif method in CACHE_DIT_PEERS:
        arm = cache_dit_arm(workload, method, knobs)
    elif method == "diffusers-taylorseer":
        kw = {k: v for k, v in knobs.items() if k != "cache"}
        if knobs["cache"] == "lite":
            config = TaylorSeerCacheConfig(use_lite_mode=True, **kw)
        else:
            ids = (taylorseer_identifiers(workload.transformer) if knobs["cache"] == "attention"
                   else ATTENTION_FF_IDENTIFIERS)
            config = TaylorSeerCacheConfig(cache_identifiers=ids, **kw)
        arm = diffusers_arm(workload, method, config)
    elif method == "diffusers-fbc":
        arm = diffusers_arm(workload, method, FirstBlockCacheConfig(**knobs))
    elif method == "diffusers-magcache":
        arm = diffusers_arm(workload, method, MagCacheConfig(mag_ratios=magcache_ratios,
                                                             num_inference_steps=workload.steps, **knobs))
    else:
        raise ValueError(f"equal-evals: unknown method {method!r}; choose from {', '.join(EQUAL_METHODS)}")
    arm.name = name
    return arm


def measure(workload: Workload, arm: Arm, seeds: list[int], reference: torch.Tensor, full_units: int
            ) -> dict[str, float]:
    """Evaluations per generation (counted), full calls and PSNR vs ``reference`` of ``arm`` on ``seeds``."""
    per_call, out = count_compute(workload, arm, seeds)
    return {"evals": round(sum(per_call) / full_units, 3), "target_calls": sum(u >= full_units for u in per_call),
            "psnr": psnr(out, reference, data_range=1.0 if workload.mode == "pipeline" else None)}


def select(search: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    """The searched entry kept at ``budget``: best calibration PSNR with ``evals <= budget`` (ties: more
    evals, then grid order); if none fits, the cheapest entry, marked ``over_budget``.

    Example:
        >>> select([{"evals": 12.0, "psnr": 30.0}, {"evals": 14.0, "psnr": 40.0}], 13.0)["evals"]
        12.0
    """
    if not search:
        raise ValueError("select: empty search")
    fits = [e for e in search if e["evals"] <= budget + 1e-9]
    if fits:
        best = max(fits, key=lambda e: (e["psnr"], e["evals"], -search.index(e)))
        return {**best, "over_budget": False}
    return {**min(search, key=lambda e: (e["evals"], -e["psnr"])), "over_budget": True}


def search_settings(workload: Workload, methods: list[str], budgets: list[float], calibration_seeds: list[int],
                    speca_thresholds: dict[str, float] | None, magcache_ratios: list[float] | None,
                    show_progress: bool = True, full_rate: list[float] | None = None,
                    schedules: list[dict[str, Any]] | None = None) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Run every candidate of every method once on ``calibration_seeds``; returns the search and full units."""
    baseline = Arm("baseline", lambda seeds: workload.generate(seeds))
    per_call, reference = count_compute(workload, baseline, calibration_seeds)
    full_units = max(per_call)
    lite = has_lite_mode(workload.transformer)
    jobs = [(m, knobs) for m in methods
            for knobs in candidate_grid(m, budgets, speca_thresholds, full_rate, schedules, lite)]
    searched: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    with torch.inference_mode():
        for method, knobs in progress(jobs, desc="equal-evals search", disable=not show_progress):
            arm = build_arm(workload, method, knobs, magcache_ratios)
            searched[method].append({"knobs": knobs, **measure(workload, arm, calibration_seeds, reference,
                                                                full_units)})
    return searched, full_units


def run_equal_evals(workload: Workload, *, methods: list[str] | None, budgets: list[float], device: torch.device,
                    repeats: int, warmup: int, quality_samples: int, calibration_samples: int | None = None,
                    show_progress: bool = True, resolve_speca: Callable[[], dict[str, float]] | None = None,
                    resolve_record: Callable[[], dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """Search each arm's setting per budget, then measure all kept settings side by side.

    Returns ``{"runs", "skipped", "equal_evals"}``: runs named ``METHOD@BUDGET`` in the order budget, method,
    with ``budget_evals`` and the ``selection``; ``skipped``: requested arms that cannot run here (``speca-replay``
    without a calibration record), with the reason; ``equal_evals`` holds the rule, the calibration seeds, where
    the replayed record came from, and every candidate's evals and PSNR.

    Raises:
        ValueError: a budget below 1, or a method the mode does not cover.
    """
    methods = list(methods or EQUAL_METHODS)
    unknown = [m for m in methods if m not in EQUAL_METHODS]
    if unknown:
        raise ValueError(f"--budget-evals: method(s) {', '.join(unknown)} have no equal-budget search; "
                         f"choose from {', '.join(EQUAL_METHODS)}")
    for b in budgets:
        if not 1 <= b <= workload.steps:
            raise ValueError(f"budget_evals={b} is out of range; allowed [1, steps={workload.steps}]")
    n = calibration_samples or workload.batch
    calibration_seeds = list(range(CALIBRATION_SEED0, CALIBRATION_SEED0 + n))
    thresholds = resolve_speca() if resolve_speca and "speca" in methods else None
    record = (resolve_record() if resolve_record and "speca-replay" in methods else None) or {}
    full_rate, schedules = record.get("full_rate"), record.get("schedules")
    skipped = []
    if "speca-replay" in methods and not full_rate:
        methods.remove("speca-replay")
        skipped.append({"method": "speca-replay", "reason": f"no speca calibration record for {workload.steps} steps "
                        "(this model's folder, or the trained tiny-dit's for a random-weight architecture)"})
    ratios = None
    if "diffusers-magcache" in methods:
        with torch.inference_mode():
            ratios = calibrate_magcache(workload.transformer, workload.steps,
                                        lambda: workload.generate(calibration_seeds))
    searched, _ = search_settings(workload, methods, budgets, calibration_seeds, thresholds, ratios, show_progress,
                                  full_rate, schedules)
    arms = [Arm("baseline", lambda seeds: workload.generate(seeds), config={"num_inference_steps": workload.steps})]
    chosen: dict[str, tuple[float, str, dict[str, Any]]] = {}
    for budget in budgets:
        for method in methods:
            pick = select(searched[method], budget)
            arm = build_arm(workload, method, pick["knobs"], ratios, name=f"{method}@{budget:g}")
            arm.peer = method not in ("taylor", "speca", "speca-replay")
            arms.append(arm)
            chosen[arm.name] = (budget, method, pick)
    runs = run_arms(workload, arms, device=device, repeats=repeats, warmup=warmup, quality_samples=quality_samples,
                    quality_chunk=max(workload.batch, 50), show_progress=show_progress)
    for run in runs[1:]:
        budget, method, pick = chosen[run["method"]]
        run.update(method=method, budget_evals=budget, over_budget=run["target_evals"] > budget + 1e-9,
                   selection={"knobs": pick["knobs"], "calibration_evals": pick["evals"],
                              "calibration_psnr": pick["psnr"], "over_budget_in_search": pick["over_budget"]})
    return {"runs": runs, "skipped": skipped, "equal_evals": {
        "budgets": budgets, "calibration_seeds": calibration_seeds, "speca_calibrated_thresholds": thresholds,
        "speca_replay_record": record.get("source"),
        "speca_replay_full_rate": full_rate, "speca_replay_searched_schedules": schedules,
        "magcache_ratios_from": "calibrate=True run on the calibration seeds" if ratios else None,
        "rule": "per arm and budget: the searched setting with the best PSNR vs the full run on the calibration "
                "seeds among those with counted evals per generation <= budget; if none, the cheapest (over_budget)",
        "search": searched}}
