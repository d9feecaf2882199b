"""The wall-clock search behind ``method="auto"`` on AR image and multimodal targets.

For these families a speculative call's speed is its calls times what each call costs on the device, and the cost
grows with the tokens a call feeds, so the search (:class:`WallTuner`) measures two things and predicts the third:

1. the target's call cost against tokens fed (:class:`~diffspec.pipelines.auto_cost.CostCurve`, timed once);
2. each candidate's acceptance on the calibration items: target calls (and drafter calls) per item and the tokens
   each call feeds;
3. its predicted seconds per item, ``calls x cost(tokens fed)`` (plus the drafter's calls at its own cost), against
   the plain loop's ``plain calls x cost(1)``.

The :data:`VERIFY_TOP` candidates with the fewest predicted seconds among those that meet the quality target are
then timed against the plain loop (interleaved, median of :data:`VERIFY_REPEATS`): predictions rank, the clock
decides where one runs more than 5% faster than the best predicted (:func:`~diffspec.pipelines.auto_cost.
clock_pick`). Both figures are in the choice (``speedup``: predicted, ``measured_speedup``: timed; ``verified``:
every timed candidate). Everything measured goes to the
:class:`~diffspec.pipelines.auto_cache.AutoCache` file of the model and settings, so a second call measures nothing.

Example:
    >>> tuner = ARTuner(target, items, cache, guidance_scale=3.0)  # doctest: +SKIP
    >>> choice = tuner.choose(ar_candidates(target.num_tokens, relaxed_cap=None))  # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..config import MethodConfig
from ..progress import progress
from .auto_cache import AutoCache
from .auto_cost import CostCurve, clock_pick, median_times
from .auto_search import candidate_key

VERIFY_REPEATS = 3
"""Timed runs of a verified config and of the plain loop over the calibration items (medians compared), after one
untimed run (:meth:`WallTuner.verify_rounds`)."""
VERIFY_TOP = 3
"""How many of the best-predicted candidates are timed against the plain loop (see :func:`~diffspec.pipelines.
auto_cost.clock_pick` for which is kept)."""


def overheads(results: list[dict[str, Any]], explained: list[float]) -> dict[str, float]:
    """Per method, the median over its measurements of the seconds per call its run took beyond what the cost
    curves explain (the round's own bookkeeping: acceptance, re-drafts, sampling), at least 0.

    Example:
        >>> overheads([{"method": "a", "wall_s": 1.0, "calls_per_item": 10}], [0.5])
        {'a': 0.05}
    """
    per: dict[str, list[float]] = {}
    for result, seconds in zip(results, explained):
        per.setdefault(result["method"], []).append((result["wall_s"] - seconds) / max(result["calls_per_item"], 1))
    return {m: round(max(statistics.median(v), 0.0), 7) for m, v in per.items()}


class WallTuner:
    """Measures candidates' acceptance and the device's call cost, predicts wall-clock, keeps the fastest.

    A round costs a target call at its feed (the cost curve) plus the method's own bookkeeping, which does not
    depend much on the feed: :func:`overheads` estimates it per method from the candidates' own runs (and the
    plain loop's from one plain run), so the prediction of a method at one window or draft length borrows the
    bookkeeping measured at its others.

    Subclasses set ``items`` (the calibration items) and give :meth:`measure_cost` (the cost curves), :meth:`run`
    (one config over the calibration items, or the plain loop for None: ``calls_per_item``, ``tokens_fed``,
    ``wall_s`` per item and method-specific counts),
    :meth:`explained` (the seconds per item the curves give for those counts) and :meth:`runners` (the plain loop
    and a config, as zero-argument calls over the items, for the check).

    Args:
        cache: where measurements are kept (a measured candidate or cost is never measured again).
        show_progress: a progress bar over the candidates measured.
    """

    items: list[Any]

    def __init__(self, cache: AutoCache, show_progress: bool = True) -> None:
        self.cache = cache
        self.show_progress = show_progress
        self.spent = 0.0
        """Seconds spent measuring in this process (added to the cache's ``calibration_s`` note)."""

    def measure_cost(self, configs: list[MethodConfig]) -> dict[str, CostCurve]:
        raise NotImplementedError

    def run(self, config: MethodConfig | None) -> dict[str, Any]:
        raise NotImplementedError

    def explained(self, counts: dict[str, Any], cost: dict[str, CostCurve]) -> float:
        raise NotImplementedError

    def runners(self, config: MethodConfig) -> tuple[Callable[[], Any], Callable[[], Any]]:
        raise NotImplementedError

    def verify_rounds(self) -> tuple[int, int]:
        """Timed and untimed runs over the calibration items of each verified config and of the plain loop."""
        return VERIFY_REPEATS, 1

    def _timed(self, work: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return work()
        finally:
            self.spent += time.perf_counter() - start

    def cost(self, configs: list[MethodConfig]) -> dict[str, CostCurve]:
        """The cost curves (from the cache, else timed now and stored)."""
        known = self.cache.note("cost")
        if known is None:
            known = {name: curve.to_dict() for name, curve in self._timed(lambda: self.measure_cost(configs)).items()}
            self.cache.put_note("cost", known)
        return {name: CostCurve.from_dict(curve) for name, curve in known.items()}

    def measure(self, config: MethodConfig | None) -> dict[str, Any]:
        """``config``'s counts on the calibration items, None: the plain loop's (from the cache when measured on at
        least as many items, else run now)."""
        key = "plain" if config is None else candidate_key(config)
        known = self.cache.measured().get(key)
        if known is None or known.get("samples", 0) < len(self.items):
            head = {"method": "plain", "config": None, "exact": True} if config is None else \
                {"method": config.method, "config": config.to_dict(), "exact": config.exact}
            known = {**head, **self._timed(lambda: self.run(config))}
            self.cache.put(key, known)
        return known

    def verify(self, config: MethodConfig) -> dict[str, float]:
        """One timed run of ``config`` against the plain loop over the calibration items (cached)."""
        name = f"verified {candidate_key(config)}"
        known = self.cache.note(name)
        if known is None or known.get("samples", 0) < len(self.items):
            plain, chosen = self.runners(config)
            device = torch.device(self.cache.settings.get("device", "cpu"))
            repeats, warmup = self.verify_rounds()
            times = self._timed(lambda: median_times({"plain": plain, "chosen": chosen}, device, repeats, warmup))
            known = {"plain_s": round(times["plain"], 5), "chosen_s": round(times["chosen"], 5),
                     "measured_speedup": round(times["plain"] / times["chosen"], 3), "samples": len(self.items)}
            self.cache.put_note(name, known)
        return known

    def choose(self, candidates: list[MethodConfig]) -> dict[str, Any]:
        """Of the best-predicted candidates, the one the clock picks (:func:`~diffspec.pipelines.auto_cost.clock_pick`;
        ``method="none"`` when none is predicted to beat the plain loop),
        with ``speedup`` (predicted), ``measured_speedup``, ``predicted_s``, ``plain_s`` (predicted, per item),
        ``overhead_s`` (per call, by method), ``cost`` (the curves) and ``calibration_s`` (seconds measured, all
        runs of this cache file together)."""
        cost = self.cost(candidates)
        bar = progress(desc="auto: calibrating", unit="candidate", disable=not self.show_progress)
        results = []
        for config in [None, *candidates]:
            results.append(dict(self.measure(config)))
            bar.update(1)
        bar.close()
        explained = [self.explained(r, cost) for r in results]
        extra = overheads(results, explained)
        for result, seconds in zip(results, explained):
            result["predicted_s"] = round(seconds + result["calls_per_item"] * extra[result["method"]], 6)
        plain_s = results[0]["predicted_s"]
        for result in results:
            result["speedup"] = round(plain_s / result["predicted_s"], 3)
        ranked = sorted(range(len(candidates)), key=lambda i: results[i + 1]["predicted_s"])
        ranked = [i for i in ranked[:VERIFY_TOP] if results[i + 1]["speedup"] > 1.0]
        choice: dict[str, Any]
        if not ranked:
            choice = {"method": "none", "config": None, "exact": True, "speedup": 1.0, "measured_speedup": None}
        else:  # predictions rank, timed runs decide among the best predicted
            measured = {i: self.verify(candidates[i])["measured_speedup"] for i in ranked}
            best = ranked[clock_pick([measured[i] for i in ranked])]
            choice = {**results[best + 1], "measured_speedup": measured[best],
                      "verified": [{"config": candidates[i].to_dict(), "speedup": results[i + 1]["speedup"],
                                    "measured_speedup": measured[i]} for i in ranked]}
        if self.spent:
            self.cache.put_note("calibration_s", round((self.cache.note("calibration_s") or 0.0) + self.spent, 3))
        return {**choice, "plain_s": plain_s, "overhead_s": extra, "cost": {k: v.to_dict() for k, v in cost.items()},
                "calibration_s": self.cache.note("calibration_s") or 0.0, "cache": str(self.cache.path),
                "measured": len(self.cache.measured()), "psnr": None}
