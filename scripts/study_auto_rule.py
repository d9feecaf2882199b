"""How often ``method="auto"``'s choice from a few calibration samples holds, and how fast it is, by resampling.

One ``diffspec bench auto`` run draws one calibration call, so its "vs best hand-tuned" is one draw of a random
quantity. This study measures every ``taylor`` setting ``auto`` can visit (orders 1 and 2, both warmups, every
number of full steps its ladders and bisections can reach) and its ``speca`` grid on a pool of items that neither
the bench's calibration call nor its held-out items use, once, per item. Then, for many random calibration sets of
``--samples`` pool items, it replays ``auto``'s search (:class:`~diffspec.pipelines.auto_search.Tuner`: ladders,
bisection, the prediction-bound rule) on those items' measurements, and judges the choice on the rest of the pool:

- ``held``: the share of the other items meeting the floor (the preset asks for 95%);
- ``vs_oracle_calls`` / ``vs_oracle_wall``: the choice's speed over the oracle's, the setting with the fewest calls
  (or the least time) meeting the floor on at least 95% of those same items; time from a fit of the measured
  seconds (:func:`fitted_seconds`).

The replay ranks by calls and leaves out the clock check of the top three (``auto``'s last step); a ``speca``
ladder uses the pool's ``tau0`` grid, not one probed on the calibration set. Timings are one pass over the pool per
setting, on this machine.

    python scripts/study_auto_rule.py --model tiny-flux --out benchmarks/results/auto-rule-tiny-flux-cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from diffspec.bench.auto import HELD_OUT, ITEMS, _Model
from diffspec.bench.timing import machine_info
from diffspec.config import QUALITY_PRESETS, ForecastConfig, SpecaConfig
from diffspec.metrics import lower_prediction_bound
from diffspec.pipelines.auto_cache import AutoCache
from diffspec.pipelines.auto_search import (
    HOLD_RATE,
    SPECA_BETAS,
    TAYLOR_ORDERS,
    Tuner,
    candidate_key,
    ranked,
    taylor_ladder,
    taylor_warmups,
)

POOL_START = ITEMS + HELD_OUT
"""The pool starts after the bench's calibration and held-out items."""
PRESETS = ("balanced", "fast")


def pool_samples(model: _Model, count: int) -> list[dict[str, Any]]:
    """One call-argument dict per pool item (its prompt or label; seeds are the tuner's ``POOL_START + i``)."""
    if model.prompts is not None:
        from diffspec.bench.dit_cache_workloads import judged_prompts

        model.prompts = judged_prompts(POOL_START + count)
    return [{**model.condition(POOL_START + i), **model.options} for i in range(count)]


def taylor_grid(steps: int, lowest: int, highest: int) -> list[ForecastConfig]:
    """Every ``taylor`` setting a ladder or bisection can visit between ``lowest`` and ``highest`` full steps, plus
    the ladders' own rungs."""
    out = []
    for warmup in taylor_warmups(steps):
        for order in TAYLOR_ORDERS:
            rungs = {c.full_steps for c in taylor_ladder(steps, order, warmup)}
            sizes = rungs | {n for n in range(max(lowest, warmup + 1), min(highest, steps - 1) + 1)}
            out += [ForecastConfig(order=order, warmup=warmup, full_steps=n) for n in sorted(sizes, reverse=True)]
    return out


def measure_grid(model: _Model, samples: list[dict[str, Any]], configs: list[Any], cache: Path) -> dict[str, Any]:
    """Every config measured on every pool item (resumable through ``cache``), with its seconds for the pool."""
    tuner = Tuner(model.target, samples, AutoCache(cache, {}, {}), floor=-math.inf, show_progress=True,
                  seed=POOL_START)
    stored = cache.with_suffix(".seconds.json")
    seconds = json.loads(stored.read_text()) if stored.exists() else {}

    def timed(key: str, run: Any) -> Any:
        if key not in seconds:
            start = time.perf_counter()
            with torch.inference_mode():
                run()
            seconds[key] = time.perf_counter() - start
            stored.write_text(json.dumps(seconds))
        return seconds[key]

    timed("plain", tuner.reference)
    for config in configs:
        timed(candidate_key(config), lambda c=config: tuner.measure(c))
    speca = []
    for beta in SPECA_BETAS:
        for config in tuner.speca_configs(beta):
            timed(candidate_key(config), lambda c=config: tuner.measure(c))
            speca.append(config)
    results = {candidate_key(c): {**tuner.measure(c), "seconds": seconds[candidate_key(c)]} for c in configs + speca}
    return {"plain_seconds": seconds["plain"], "results": results,
            "speca": {beta: [candidate_key(c) for c in speca if c.beta == beta] for beta in SPECA_BETAS}}


class Replay(Tuner):
    """``auto``'s search on a subset of the pool, every measurement read from the grid."""

    def __init__(self, grid: dict[str, Any], chosen: np.ndarray, conditions: list[str], floor: float,
                 coverage: float = HOLD_RATE) -> None:
        super().__init__(None, [{"num_inference_steps": grid["steps"]}], AutoCache(Path("/dev/null"), {}, {}),
                         floor=floor, show_progress=False)
        self.grid, self.chosen, self.coverage = grid, chosen, coverage
        self.conditions = len({conditions[i] for i in chosen})
        self.missing = 0

    def measure(self, config: Any) -> dict[str, Any] | None:
        full = self.grid["results"].get(candidate_key(config))
        if full is None:
            self.missing += not config.exact
            return None
        values = np.asarray(full["psnr_samples"])[self.chosen]
        return {**full, "psnr": float(values.mean()), "psnr_min": float(values.min()),
                "psnr_bound": lower_prediction_bound(values.tolist(), self.coverage, self.conditions)}

    def speca_configs(self, beta: float) -> list[Any]:
        return [SpecaConfig(**{k: v for k, v in json.loads(key).items() if k != "method"})
                for key in self.grid["speca"][beta]]


def fitted_seconds(results: list[dict[str, Any]], steps: int) -> np.ndarray:
    """Each setting's seconds for the pool from a least-squares fit, ``seconds = a[method] + b * full calls per
    item``: one pass per setting on a shared CPU varies by about 10%, the fit by far less."""
    full = np.asarray([steps / r["speedup"] for r in results])
    methods = sorted({r["method"] for r in results})
    x = np.column_stack([[r["method"] == m for r in results] for m in methods] + [full]).astype(float)
    coef = np.linalg.lstsq(x, np.asarray([r["seconds"] for r in results]), rcond=None)[0]
    return x @ coef


def replay(grid: dict[str, Any], conditions: list[str], floor: float, samples: int, draws: int,
           coverage: float = HOLD_RATE, seed: int = 0) -> dict[str, Any]:
    """``draws`` calibration sets of ``samples`` pool items: ``auto``'s choice on each, judged on the rest."""
    results = list(grid["results"].values())
    psnr = np.asarray([r["psnr_samples"] for r in results])
    speed = np.asarray([r["speedup"] for r in results])
    wall = fitted_seconds(results, grid["steps"])
    index = {candidate_key(r["config"]): i for i, r in enumerate(results)}
    rng = np.random.default_rng(seed)
    held, calls_ratio, wall_ratio, missing, picks = [], [], [], 0, {}
    for _ in range(draws):
        chosen = rng.choice(psnr.shape[1], samples, replace=False)
        rest = np.setdiff1d(np.arange(psnr.shape[1]), chosen)
        tuner = Replay(grid, chosen, conditions, floor, coverage)
        best = ranked(tuner.search(), floor)
        missing += tuner.missing
        rate = (psnr[:, rest] >= floor).mean(axis=1)
        ok = (rate >= HOLD_RATE) & (speed > 1.0)
        if not best or not ok.any():
            continue
        pick = index[candidate_key(best[0]["config"])]
        picks[_label(results[pick])] = picks.get(_label(results[pick]), 0) + 1
        held.append(rate[pick])
        calls_ratio.append(speed[pick] / speed[ok].max())
        wall_ratio.append(wall[ok].min() / wall[pick])
    return {"samples": samples, "coverage": coverage, "draws": draws, "chose": len(held), "missing_lookups": missing,
            "held": _spread(held), "held_at_least_95": round(float(np.mean(np.asarray(held) >= HOLD_RATE)), 3),
            "vs_oracle_calls": _spread(calls_ratio), "vs_oracle_wall": _spread(wall_ratio),
            "vs_oracle_wall_at_least_0_9": round(float(np.mean(np.asarray(wall_ratio) >= 0.9)), 3),
            "choices": dict(sorted(picks.items(), key=lambda kv: -kv[1])[:8])}


def _label(result: dict[str, Any]) -> str:
    c = result["config"]
    if c["method"] == "taylor":
        return f"taylor o{c['order']} w{c['warmup']} {c['full_steps']}"
    return f"speca beta {c['beta']} tau0 {c['tau0']:.4g}"


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = np.asarray(values)
    return {"mean": round(float(v.mean()), 3), "p10": round(float(np.quantile(v, 0.1)), 3),
            "median": round(float(np.median(v)), 3), "p90": round(float(np.quantile(v, 0.9)), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny-dit", "tiny-flux"), required=True)
    parser.add_argument("--pool", type=int, default=200, help="pool items (seeds and prompts after the bench's)")
    parser.add_argument("--lowest", type=int, default=None, help="fewest full steps measured (default: steps / 5)")
    parser.add_argument("--highest", type=int, default=None, help="most full steps measured (default: steps / 2)")
    parser.add_argument("--samples", default="16,32", help="calibration set sizes replayed")
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--coverage", default=str(HOLD_RATE), help="prediction-bound coverages replayed")
    parser.add_argument("--cache", type=Path, default=None, help="measurement cache (default: /tmp)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = _Model(args.model, torch.device("cpu"))
    steps = int(model.options["num_inference_steps"])
    lowest, highest = args.lowest or steps // 5, args.highest or steps // 2
    samples = pool_samples(model, args.pool)
    cache = args.cache or Path(f"/tmp/auto-rule-{args.model}-{args.pool}.json")
    grid = {"steps": steps, **measure_grid(model, samples, taylor_grid(steps, lowest, highest), cache)}
    conditions = [json.dumps(s, sort_keys=True, default=str) for s in samples]
    study = {p: [replay(grid, conditions, QUALITY_PRESETS[p], int(n), args.draws, float(c))
                 for c in args.coverage.split(",") for n in args.samples.split(",")] for p in PRESETS}
    doc = {"suite": "auto-rule-study", "machine": machine_info(torch.device("cpu")),
           "model": {"name": args.model, "weights": "trained"},
           "workload": {"pool": args.pool, "pool_start": POOL_START, "call": model.options, "draws": args.draws,
                        "full_steps_measured": [lowest, highest], "settings": len(grid["results"]),
                        "plain_seconds": round(grid["plain_seconds"], 2)},
           "study": study,
           "settings": {_label(r): {"speedup": r["speedup"], "seconds": round(r["seconds"], 2), "fitted_seconds":
                                    round(float(fit), 2),
                                    "pool_rate": {p: round(float(np.mean(np.asarray(r["psnr_samples"])
                                                                       >= QUALITY_PRESETS[p])), 3) for p in PRESETS}}
                        for r, fit in zip(grid["results"].values(), fitted_seconds(list(grid["results"].values()),
                                                                                  steps))},
           "notes": [__doc__.split("\n\n")[1].replace("\n", " ")]}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(study, indent=1))


if __name__ == "__main__":
    main()
