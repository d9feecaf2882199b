"""The ``auto`` suite: what ``method="auto"`` chooses on the shipped models, what choosing costs, and whether it holds.

For every model (the diffusion models ``tiny-dit`` and ``tiny-flux``, the AR image models ``tiny-ar``,
``tiny-ar-tex`` and ``tiny-ar-noisy``, ``tiny-vlm``) and quality preset, from an empty cache: the choice, its
calibration cost in seconds (the first ``calibrate`` call, everything measured) and after how many items it pays for
itself (``calibration_s / (plain - chosen seconds per item)``), the share of ``HELD_OUT`` items (seeds, labels or
scenes not used for tuning) that meet the preset (diffusion: PSNR against full compute at the floor; AR image: exact
methods, or ``gsd`` whose TV cap holds by construction; ``tiny-vlm``: greedy output identical to plain), and its
wall-clock speedup next to the hand-tuned arms, all timed in the same process, interleaved (median of ``repeats``),
and its speed over the best hand-tuned arm at the preset's quality (``speed_vs_best_hand_tuned``, see
:func:`best_hand_tuned`).

Example:
    >>> doc = run_auto("tiny-ar", repeats=2)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from ..api import SpeculativePipeline
from ..metrics import psnr
from ..pipelines.auto_cache import CACHE_ENV, AutoCache, model_fingerprint
from ..pipelines.auto_cost import interleaved_times
from ..pipelines.auto_search import HOLD_RATE, Tuner
from .report_readers import table
from .timing import latency_summary, machine_info

DIFFUSION_MODELS = ("tiny-dit", "tiny-flux")
AR_MODELS = ("tiny-ar", "tiny-ar-tex", "tiny-ar-noisy")
MODELS = (*DIFFUSION_MODELS, *AR_MODELS, "tiny-vlm")
AR_ARMS = {f"{m} w{w}": {"method": m, "window": w} for m in ("sjd", "mc-sjd") for w in (8, 16, 32, 64)}
PRESETS = {**{m: ("balanced", "fast") for m in DIFFUSION_MODELS}, **{m: ("exact", "fast") for m in AR_MODELS},
           "tiny-vlm": ("balanced",)}
HAND_TUNED = {**{m: {"taylor": {"method": "taylor"}, "speca": {"method": "speca"}} for m in DIFFUSION_MODELS},
              **{m: AR_ARMS for m in AR_MODELS},
              "tiny-vlm": {f"draft k={k}": {"method": "draft", "num_draft_tokens": k} for k in (5, 8, 12)}}
"""Each model's hand-set arms (defaults: ``taylor``, ``speca``; ``sjd`` window 16, ``mc-sjd`` 64, ``draft`` k = 5).
On the diffusion models each preset also gets its best hand-tuned arm (:func:`best_hand_tuned`), found on the
held-out items themselves; AR image and multimodal arms are exact, so every one of them is at equal quality."""
KNOBS = ("window", "num_draft_tokens", "full_steps", "warmup", "order", "tau0", "max_tv", "draft_layers")
"""The knobs a table row and a verified candidate show."""
ITEMS = 16
"""Class labels (``i % 10``), prompts or scenes of the call ``auto`` calibrates on: as many as
``AutoConfig.samples``, so each calibration sample has its own prompt (the labels repeat after ten)."""
TIMED = {**{m: 16 for m in DIFFUSION_MODELS}, **{m: 64 for m in (*AR_MODELS, "tiny-vlm")}}
"""Held-out items each arm is timed over (one call each): a diffusion schedule makes the same calls on every item,
while an AR image's or a caption's calls vary from item to item (on ``tiny-ar``, ``sjd`` at window 16 averaged 14.0 to
17.5 calls per image over eight sets of 16 images, 15.3 over all 128)."""
HELD_OUT = 100
"""Items after the calibration call's, judged against the preset."""
DIT_STEPS = 50
"""Steps of a diffusion model whose folder names none (``tiny-dit``: its DDIM sampler's 50; ``tiny-flux``: 28)."""


class _Model:
    """One model's workload: calibration call, timed items (one call each), held-out quality check."""

    _full: list[Any] | None = None

    def __init__(self, name: str, device: torch.device) -> None:
        self.name, self.device = name, device
        if name in DIFFUSION_MODELS:
            from ..models import load_pipeline
            from ..models.dit import call_defaults, model_settings
            from .dit_cache_workloads import judged_prompts

            self.target = load_pipeline(name, device=device)
            self.target.set_progress_bar_config(disable=True)
            steps = model_settings(self.target).get("steps", DIT_STEPS)
            self.options = {"num_inference_steps": steps, **call_defaults(self.target)}
            self.prompts = judged_prompts(ITEMS + HELD_OUT) if name == "tiny-flux" else None
            self.call = {**self.condition(0, ITEMS), **self.options}
        elif name in AR_MODELS:
            from ..models import load_ar_target

            self.target = load_ar_target(name, device=device)
            self.call = {"class_labels": [i % 10 for i in range(ITEMS)]}
        else:
            from ..data import render_scenes
            from ..models.tiny_vlm import MAX_CAPTION_TOKENS, caption_inputs, load_tiny_vlm

            model, processor, self.drafter, _ = load_tiny_vlm(device=device)
            self.target = (model, processor)
            scenes = render_scenes(ITEMS + max(TIMED[name], HELD_OUT), seed=10**6)[0]
            inputs = {k: v.to(device) for k, v in caption_inputs(processor, scenes).items()}
            self.rows = [{k: v[i:i + 1] for k, v in inputs.items()} for i in range(len(scenes))]
            self.options = {"max_new_tokens": MAX_CAPTION_TOKENS, "do_sample": False}
            self.call = {k: v[:ITEMS] for k, v in inputs.items()} | self.options

    def condition(self, start: int, count: int = 1) -> dict[str, list[Any]]:
        """A diffusion model's conditions of items ``start`` on: class labels ``i % 10`` or held-out prompt ``i``."""
        if self.prompts is not None:
            return {"prompt": self.prompts[start:start + count]}
        return {"class_labels": [i % 10 for i in range(start, start + count)]}

    def wrap(self, method: str, **overrides: Any) -> Any:
        extra = {"draft": self.drafter} if self.name == "tiny-vlm" and method in ("auto", "draft") else {}
        spec = SpeculativePipeline.from_pipe(self.target, method=method, **overrides, **extra)
        if self.name in AR_MODELS:
            spec.set_progress_bar_config(disable=True)
        return spec

    def one(self, runner: Callable[..., Any], i: int) -> Any:
        """Item ``i`` (seed / label / scene ``i``) through ``runner`` (a diffusion pipeline takes one method at a
        time: its wrappers are enabled for the call only)."""
        if self.name == "tiny-vlm":
            return runner(**self.rows[i], **self.options)
        if self.name in AR_MODELS:
            return runner(class_labels=[i % 10], generator=torch.Generator(self.device).manual_seed(i),
                          output_type="tokens")
        wrapped = isinstance(runner, SpeculativePipeline)
        if wrapped:
            runner.enable()
        try:
            return runner(**self.condition(i), **self.options, generator=torch.Generator(self.device).manual_seed(i),
                          output_type="np")
        finally:
            if wrapped:
                runner.disable()

    def plain(self, spec: Any) -> Callable[..., Any]:
        """The full-compute runner next to ``spec``."""
        if self.name in DIFFUSION_MODELS:
            return self.target
        return getattr(spec, "run_unchanged", None) or spec.plain

    def held_out(self, spec: Any, choice: dict[str, Any]) -> float:
        """Share of the held-out items (``ITEMS`` on) meeting the preset."""
        if self.name in AR_MODELS:
            return 1.0 if choice["exact"] or (choice["config"] or {}).get("max_tv") is not None else 0.0
        if self.name == "tiny-vlm":
            full = self.full_held_out(spec)
            return sum(torch.equal(self.one(spec, i).sequences, full[i - ITEMS].sequences)
                       for i in range(ITEMS, ITEMS + HELD_OUT)) / HELD_OUT
        if choice["floor"] is None:
            return 1.0
        return sum(v >= choice["floor"] for v in self.held_out_psnr(spec)) / HELD_OUT

    def held_out_psnr(self, spec: Any) -> list[float]:
        """A diffusion runner's PSNR against full compute on each held-out item."""
        full = self.full_held_out(spec)
        return [psnr(torch.as_tensor(self.one(spec, i).images), torch.as_tensor(full[i - ITEMS].images), 1.0)
                for i in range(ITEMS, ITEMS + HELD_OUT)]

    def full_held_out(self, spec: Any) -> list[Any]:
        """The full-compute outputs of the held-out items (computed once)."""
        if self._full is None:
            self._full = [self.one(self.plain(spec), i) for i in range(ITEMS, ITEMS + HELD_OUT)]
        return self._full


def best_hand_tuned(model: _Model, floors: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per preset, the fewest-calls candidate of ``auto``'s own grid that meets the preset's floor on at least
    :data:`~diffspec.pipelines.auto_search.HOLD_RATE` of the held-out items, every candidate measured on those items
    (an oracle: tuned on the data it is judged on, the best a user sweeping knobs by hand could pick): every rung of
    every ladder, and ``auto``'s own search judged on the held-out items (its bisections)."""
    held_out = [{**model.condition(i), **model.options} for i in range(ITEMS, ITEMS + HELD_OUT)]
    cache = AutoCache.for_settings(model_fingerprint(model.target), {"oracle": "held-out", **model.options})
    tuner = Tuner(model.target, held_out, cache, floor=-math.inf, show_progress=False, seed=ITEMS)
    grid, best = tuner.search(prune=False), {}
    for preset, floor in floors.items():
        tuner.meets = lambda r, floor=floor: _held_out_rate(r, floor) >= HOLD_RATE
        found = grid + tuner.search()
        rated = [{**r, "held_out_rate": _held_out_rate(r, floor)} for r in found
                 if not r["exact"] and r["speedup"] > 1.0]
        ok = [r for r in rated if r["held_out_rate"] >= HOLD_RATE]
        if ok:
            best[preset] = max(ok, key=lambda r: (r["speedup"], -r["evals"]))
    return best


def _held_out_rate(result: dict[str, Any], floor: float) -> float:
    return sum(v >= floor for v in result["psnr_samples"]) / len(result["psnr_samples"])


def _items(model: _Model, runner: Callable[..., Any]) -> Callable[[], Any]:
    return lambda: [model.one(runner, i) for i in range(ITEMS, ITEMS + TIMED[model.name])]


def _bench_model(name: str, device: torch.device, repeats: int, show_progress: bool) -> list[dict[str, Any]]:
    model, runs = _Model(name, device), []
    autos: dict[str, Any] = {}
    for preset in PRESETS[name]:
        spec = model.wrap("auto", quality=preset)
        start = time.perf_counter()
        with torch.inference_mode():
            choice = spec.calibrate(**model.call)
        autos[preset] = (spec, choice, time.perf_counter() - start)
        if name in DIFFUSION_MODELS:
            spec.disable()
    configs = dict(HAND_TUNED[name])
    floors = {p: c["floor"] for p, (_, c, _) in autos.items()}
    oracle = best_hand_tuned(model, floors) if name in DIFFUSION_MODELS else {}
    for preset, found in oracle.items():
        configs[f"best hand-tuned ({preset})"] = dict(found["config"])
    hand = {}
    for arm, cfg in configs.items():
        hand[arm] = model.wrap(**cfg)
        if name in DIFFUSION_MODELS:
            hand[arm].disable()
    first = next(iter(autos.values()))[0]
    arms = {"baseline": _items(model, model.plain(first)), **{a: _items(model, s) for a, s in hand.items()},
            **{f"auto ({p})": _items(model, s) for p, (s, _, _) in autos.items()}}
    with torch.inference_mode():
        times = interleaved_times(arms, device, repeats=repeats, warmup=1)
    timed = TIMED[name]
    per_item = {arm: statistics.median(seconds) / timed for arm, seconds in times.items()}
    for arm, seconds in per_item.items():
        run: dict[str, Any] = {"model": name, "method": arm, "peer": False,
                               "per_item_s": latency_summary([t / timed for t in times[arm]]),
                               "speedup_vs_baseline": round(per_item["baseline"] / seconds, 3)}
        if name in DIFFUSION_MODELS:
            run["call"] = model.options
        if arm in hand:
            run["config"] = hand[arm].config.to_dict()
        if arm in HAND_TUNED[name] and name in DIFFUSION_MODELS:
            with torch.inference_mode():
                values = model.held_out_psnr(hand[arm])
            run["held_out"] = {"rate": {p: sum(v >= f for v in values) / HELD_OUT for p, f in floors.items()},
                               "psnr": round(sum(values) / HELD_OUT, 3), "psnr_min": round(min(values), 3)}
        if arm.startswith("best hand-tuned"):
            found = oracle[arm[len("best hand-tuned ("):-1]]
            run["held_out"] = {"rate": found["held_out_rate"], "psnr": found["psnr"], "psnr_min": found["psnr_min"]}
        if arm.startswith("auto"):
            preset = arm[len("auto ("):-1]
            spec, choice, spent = autos[preset]
            saved = per_item["baseline"] - seconds
            with torch.inference_mode():
                rate = model.held_out(spec, choice)
            rival = _best_rival(name, preset, per_item, floors)
            run.update({"config": choice["config"], "auto": {
                "best_hand_tuned": rival, "speed_vs_best_hand_tuned":
                    round(per_item[rival] / seconds, 3) if rival else None,
                "quality": preset, "choice": choice["method"], "exact": choice["exact"],
                "calibration_s": round(spent, 2), "pays_off_after_items": round(spent / saved) if saved > 0 else None,
                "held_out_rate": round(rate, 3), "held_out_items": HELD_OUT,
                "expected_speedup": choice["speedup"], "calibration_measured_speedup": choice.get("measured_speedup"),
                "calibration_verified": [{**_knobs(v["config"]), "speedup": v["speedup"],
                                          "measured_speedup": v["measured_speedup"]}
                                         for v in choice.get("verified", [])],
                "calibration_psnr": choice.get("psnr")}})
        runs.append(run)
    return runs


def _knobs(config: dict[str, Any]) -> dict[str, Any]:
    """A config's method and the knobs ``auto`` tunes."""
    return {k: config[k] for k in ("method", *KNOBS) if k in config}


def _best_rival(name: str, preset: str, per_item: dict[str, float], floors: dict[str, float]) -> str | None:
    """The fastest hand-tuned arm at the preset's quality: on a diffusion model the fastest on the clock of the oracle
    arms of this preset and the stricter ones (what meets a higher floor on the held-out items meets this one; None
    when none does), else the fastest arm of :data:`HAND_TUNED` (all exact)."""
    if name in DIFFUSION_MODELS:
        arms = [f"best hand-tuned ({p})" for p, floor in floors.items() if floor >= floors[preset]]
        return min((a for a in arms if a in per_item), key=per_item.__getitem__, default=None)
    return min(HAND_TUNED[name], key=per_item.__getitem__)


def run_auto(model: str | None = None, *, device: str | None = None, repeats: int = 3, show_progress: bool = True,
             **_: Any) -> dict[str, Any]:
    """Run the suite on ``model`` (a comma-separated subset of :data:`MODELS`; default all) from empty caches.

    Raises:
        ValueError: an unknown model.
    """
    names = [m.strip() for m in (model or ",".join(MODELS)).split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise ValueError(f"auto: unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    before = os.environ.get(CACHE_ENV)
    runs = []
    try:
        for name in names:
            with tempfile.TemporaryDirectory() as folder:
                os.environ[CACHE_ENV] = folder  # every model calibrates from nothing
                runs += _bench_model(name, dev, repeats, show_progress)
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before
    return {"suite": "auto", "machine": machine_info(dev), "model": {"name": ",".join(names), "weights": "trained"},
            "workload": {"items": ITEMS, "timed_items": {m: TIMED[m] for m in names}, "held_out": HELD_OUT,
                         "repeats": repeats,
                         "presets": {m: list(PRESETS[m]) for m in names}},
            "runs": runs,
            "notes": ["per_item_s.median: seconds per item (one image or caption per call), every arm of a model "
                      "timed interleaved in one process after one warm-up (min and max: the spread of the repeats); "
                      "speedup_vs_baseline against full compute.",
                      "held_out on a diffusion model's hand-set arms (taylor, speca at their defaults): the share of "
                      "the held-out items meeting each preset's floor, their mean and lowest PSNR.",
                      "auto.calibration_s: the preset's first calibrate call (cost curve, every candidate, the check "
                      "run), the model's first preset from an empty cache, later presets reusing what it measured; "
                      "pays_off_after_items: calibration_s over the seconds saved per item.",
                      "auto.held_out_rate: items not used for tuning that meet the preset (diffusion: PSNR at the "
                      "floor; tiny-ar: exact, or gsd's TV cap, which holds by construction; tiny-vlm: greedy "
                      "captions identical to plain).",
                      "auto.speed_vs_best_hand_tuned: the auto arm's speed over the best hand-tuned arm at its "
                      "quality: on a diffusion model the fastest on the clock of the best_hand_tuned arms of this "
                      "preset and the stricter ones (each the fewest-calls setting of auto's own grid meeting its "
                      "floor on at least 95% of the held-out items, chosen on those items: an oracle); "
                      "AR image and tiny-vlm: the fastest hand-set arm timed here (all exact)."]}


def auto_table(doc: dict[str, Any]) -> str:
    """One row per model and arm: speedup per item, and for ``auto`` arms the choice, its cost and held-out rate."""
    def choice(run: dict[str, Any]) -> str:
        config = run.get("config") or {}
        knobs = {k: config[k] for k in KNOBS if k in config}
        return f"{config.get('method', run['method'])} {knobs}" if config else run["method"]

    def auto(key: str) -> Callable[[dict[str, Any]], Any]:
        return lambda run: (run.get("auto") or {}).get(key, "")

    def held_out(run: dict[str, Any]) -> Any:
        rate = run["auto"]["held_out_rate"] if "auto" in run else (run.get("held_out") or {}).get("rate", "")
        return ", ".join(f"{p} {r:.2f}" for p, r in rate.items()) if isinstance(rate, dict) else rate

    return table(doc["runs"], [
        ("model", "---", lambda r: r["model"]), ("arm", "---", lambda r: r["method"]), ("config", "---", choice),
        ("s / item", "---:", lambda r: r["per_item_s"]["median"]), ("speedup", "---:", lambda r: r["speedup_vs_baseline"]),
        ("calibration s", "---:", auto("calibration_s")), ("pays off after (items)", "---:", auto("pays_off_after_items")),
        ("held-out rate", "---:", held_out),
        ("vs best hand-tuned", "---:", auto("speed_vs_best_hand_tuned"))])
