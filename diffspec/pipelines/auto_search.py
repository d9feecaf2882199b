"""The search behind ``method="auto"``: measure the diffusion methods on a few calls, keep the fastest that passes.

Candidates, per method (each is one generation of the calibration samples):

- ``coupling`` and ``autospec`` at lookahead 4 and 8, where the pipeline and scheduler allow them
  (:func:`~diffspec.pipelines.prepare.check_pair`). Exact: they meet every quality target; only their speed is
  measured. Every preset considers them, ``"exact"`` only them.
- ``taylor`` at orders 1 and 2, from 75% down to 10% of the steps in full (:data:`TAYLOR_FRACTIONS`), with the
  default warmup and front-loaded (:data:`FRONT_WARMUP`); where a ladder stops, the number of full steps between its
  last rung that met the floor and the first that did not is found by bisection (:meth:`Tuner.bisect`).
- ``speca``: ``tau0`` log-spaced over the verifier errors of a probe run (:func:`~diffspec.forecast.calibrate.
  tau_grid`) at each ``beta`` of :data:`SPECA_BETAS`.

A relaxed candidate's quality is its PSNR against the full-compute output of the same seeds, per sample: it meets
the floor when a new item would, with 95% confidence: the lower 95% prediction bound of the per-sample PSNRs
(:func:`~diffspec.metrics.lower_prediction_bound`, never above the worst sample) is at the floor. The bound counts
the distinct prompts (or labels) as the independent draws, not the samples: a new item is a new prompt, and samples
of one prompt at other seeds vary less than prompts do, so calibrating on more distinct prompts tightens it. The
mean and the worst sample are reported too. Each ladder (one order, one ``beta``) runs from its safest rung to its fastest and
stops at the first rung below the floor, so a stricter floor measures less. Speed is
:attr:`~diffspec.stats.SpecStats.speedup` over the samples: the plain loop's sequential transformer calls over the
method's (``steps x branches / target_calls``), which does not depend on the device (it leaves out a draft's or
verifier's own cost). The candidates that meet the floor and make fewer calls than the plain loop are ranked by it
(ties: exact first, then the least work, ``SpecStats.target_evals`` plus a verifier's, then the higher PSNR); the
:data:`VERIFY_TOP` best ranked are timed against the plain pipeline on the device (:meth:`Tuner.verify`): calls
rank, the clock decides where one runs more than 5% faster than the best ranked (a verifier's or a forecast's own
cost shows there; :func:`~diffspec.pipelines.auto_cost.clock_pick`).

Example:
    >>> tuner = Tuner(pipe, samples, AutoCache.for_call(pipe, call), floor=32.0)  # doctest: +SKIP
    >>> best = ranked(tuner.search(), 32.0)[0]  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from ..api import SpeculativePipeline
from ..config import AutospecConfig, CouplingConfig, ForecastConfig, MethodConfig, SpecaConfig
from ..forecast.calibrate import probe_config, tau_grid
from ..metrics import lower_prediction_bound, psnr_per_sample
from ..progress import progress
from .auto_cache import AutoCache
from .auto_cost import median_times

TAYLOR_FRACTIONS = (0.75, 0.5, 0.4, 0.33, 0.25, 0.2, 0.15, 0.1)
"""Shares of the steps ``taylor`` candidates compute in full, safest first."""

TAYLOR_ORDERS = (1, 2)
FRONT_WARMUP = 0.25
"""The share of the steps a front-loaded ``taylor`` ladder computes in full before its first forecast. The early
steps decide a sample's layout: a forecast there can turn it into another image, which no later full step repairs
(``docs/auto.md``: ``tiny-flux``)."""
SPECA_BETAS = (0.3, 1.0, 3.0)
SPECA_TAUS = 5
"""``tau0`` values per ``beta``."""

EXACT_CANDIDATES = (CouplingConfig(lookahead=4), CouplingConfig(lookahead=8), AutospecConfig(lookahead=4),
                    AutospecConfig(lookahead=8))

HOLD_RATE = 0.95
"""The share of new items a relaxed choice should meet its floor on (the prediction bound's coverage)."""

VERIFY_TOP = 3
"""How many of the passing candidates with the fewest calls are timed against the plain pipeline."""
VERIFY_SAMPLES = 2
VERIFY_REPEATS = 3

CALIBRATION_SEED = 5000
"""Sample ``i`` of a calibration uses seed ``CALIBRATION_SEED + i``."""


def candidate_key(config: MethodConfig | dict[str, Any]) -> str:
    """The cache key of a candidate: its config (or its config's dict) as sorted JSON."""
    return json.dumps(config if isinstance(config, dict) else config.to_dict(), sort_keys=True, default=list)


def taylor_ladder(steps: int, order: int, warmup: int | None = None) -> list[ForecastConfig]:
    """``taylor`` at ``order`` from the most full steps to the fewest (each above ``warmup``, default
    ``ForecastConfig``'s, and below ``steps``).

    Example:
        >>> [c.full_steps for c in taylor_ladder(20, 1)], [c.full_steps for c in taylor_ladder(20, 1, warmup=5)]
        ([15, 10, 8, 7, 5, 4], [15, 10, 8, 7])
    """
    warmup = ForecastConfig().warmup if warmup is None else warmup
    sizes = sorted({round(steps * f) for f in TAYLOR_FRACTIONS if warmup < round(steps * f) < steps}, reverse=True)
    return [ForecastConfig(order=order, warmup=warmup, full_steps=n) for n in sizes]


def taylor_warmups(steps: int) -> tuple[int, ...]:
    """The warmups ``taylor`` ladders start from: ``ForecastConfig``'s default and :data:`FRONT_WARMUP` of ``steps``.

    Example:
        >>> taylor_warmups(28), taylor_warmups(50), taylor_warmups(8)
        ((3, 7), (3, 12), (3,))
    """
    default = ForecastConfig().warmup
    return tuple(sorted({default, max(default, round(steps * FRONT_WARMUP))}))


def distinct_conditions(samples: list[dict[str, Any]]) -> int:
    """How many distinct call-argument dicts ``samples`` holds (they differ only in their prompt or label).

    Example:
        >>> distinct_conditions([{"prompt": ["a"]}, {"prompt": ["b"]}, {"prompt": ["a"]}])
        2
    """
    return len({json.dumps(s, sort_keys=True, default=str) for s in samples})


def _images(out: Any) -> torch.Tensor:
    data = getattr(out, "frames", None)
    data = getattr(out, "images", None) if data is None else data
    return torch.as_tensor(np.asarray(data, dtype=np.float32))


class Tuner:
    """Measures candidates on the calibration samples, reading and writing ``cache``.

    Args:
        pipe: the diffusers pipeline.
        samples: one dict of call arguments per sample (one prompt or label each, no generator).
        cache: where measurements are kept (a measured candidate is never run again).
        floor: the PSNR floor (None: exact methods only).
        show_progress: a progress bar over the candidates run.
    """

    def __init__(self, pipe: Any, samples: list[dict[str, Any]], cache: AutoCache, floor: float | None,
                 show_progress: bool = True, seed: int = CALIBRATION_SEED) -> None:
        self.pipe, self.samples, self.cache, self.floor, self.seed = pipe, samples, cache, floor, seed
        self.meets: Callable[[dict[str, Any]], bool] = lambda result: worst_psnr(result) >= (
            -math.inf if floor is None else floor)
        """Whether a relaxed measurement meets the floor: its prediction bound is at ``floor`` (the benchmark's
        held-out oracle swaps in its own rule)."""
        self.conditions = distinct_conditions(samples)
        """How many distinct prompts (or labels) the samples hold: the independent draws of the PSNR bound."""
        self.refused: dict[str, str] = {}
        """Method -> why the pipeline refused it (exact methods on a deterministic or unsupported scheduler)."""
        self._reference: torch.Tensor | None = None
        self._bar = progress(desc="auto: calibrating", unit="candidate", disable=not show_progress)

    def _generate(self, runner: Any, count: int | None = None) -> tuple[torch.Tensor, list[Any]]:
        images, stats = [], []
        for i, kwargs in enumerate(self.samples[:count]):
            generator = torch.Generator("cpu").manual_seed(self.seed + i)
            out = runner(**kwargs, generator=generator, output_type="np")
            images.append(_images(out))
            stats.append(copy.deepcopy(getattr(runner, "stats", None)))  # the wrapper resets its own per call
        return torch.cat(images), stats

    def reference(self) -> torch.Tensor:
        """The full-compute output of the samples (computed once, when a relaxed candidate needs it)."""
        if self._reference is None:
            self._reference = self._generate(self.pipe)[0]
        return self._reference

    def measure(self, config: MethodConfig) -> dict[str, Any] | None:
        """``config``'s measurement (from the cache when it was made on at least as many samples, else run now and
        stored); None when the pipeline refuses it."""
        key = candidate_key(config)
        if (known := self.cache.measured().get(key)) is not None and known.get("samples", 0) >= len(self.samples):
            return known
        try:
            runner = SpeculativePipeline.from_pipe(self.pipe, method=config)
        except ValueError as exc:
            self.refused.setdefault(config.method, str(exc))
            return None
        try:
            images, stats = self._generate(runner)
        finally:
            runner.disable()
        plain = sum(s.steps * s.branches for s in stats)
        calls = sum(s.target_calls for s in stats)
        per_sample = None if config.exact else psnr_per_sample(images, self.reference(), 1.0)
        result = {"method": config.method, "config": config.to_dict(), "exact": config.exact,
                  "psnr": None if per_sample is None else round(float(per_sample.mean()), 3),
                  "psnr_min": None if per_sample is None else round(float(per_sample.min()), 3),
                  "psnr_bound": None if per_sample is None else round(lower_prediction_bound(
                      per_sample.tolist(), HOLD_RATE, self.conditions), 3),
                  "psnr_samples": None if per_sample is None else [round(float(v), 3) for v in per_sample],
                  "speedup": round(plain / max(calls, 1), 4), "target_calls": calls, "plain_calls": plain,
                  "evals": round(sum(s.target_evals + s.extra.get("verifier_evals", 0.0) for s in stats), 3),
                  "samples": len(self.samples)}
        if config.method == "speca":
            result["checked_errors"] = [e for s in stats for _, e, _ in s.extra.get("checked_errors", [])]
        self.cache.put(key, result)
        self._bar.update(1)
        return result

    def verify(self, result: dict[str, Any]) -> float:
        """The wall-clock speedup of a measured candidate against the plain pipeline on the first
        :data:`VERIFY_SAMPLES` samples (interleaved, median of :data:`VERIFY_REPEATS`; cached)."""
        name = f"verified {candidate_key(result['config'])}"
        if (known := self.cache.note(name)) is None:
            config = dict(result["config"])
            runner = SpeculativePipeline.from_pipe(self.pipe, method=config.pop("method"), **config)
            runner.disable()

            def with_method() -> None:
                runner.enable()
                try:
                    self._generate(runner, VERIFY_SAMPLES)
                finally:
                    runner.disable()

            times = median_times({"plain": lambda: self._generate(self.pipe, VERIFY_SAMPLES), "method": with_method},
                                 torch.device(self.pipe.device), repeats=VERIFY_REPEATS, warmup=1)
            known = round(times["plain"] / times["method"], 3)
            self.cache.put_note(name, known)
        return known

    def ladder(self, configs: Iterable[MethodConfig]) -> list[dict[str, Any]]:
        """Measure ``configs`` (safest first) until one falls below the floor (that one included)."""
        out = []
        for config in configs:
            result = self.measure(config)
            if result is None:
                break
            out.append(result)
            if not self.meets(result):
                break
        return out

    def bisect(self, order: int, warmup: int, good: int, bad: int) -> list[dict[str, Any]]:
        """``taylor`` at ``order`` and ``warmup`` between ``good`` full steps (meets the floor) and ``bad`` (does
        not): the fewest full steps that meet it, by bisection (the rungs of a ladder are 5-25% of the steps apart).
        Returns the measurements made.

        Example:
            >>> tuner.bisect(order=2, warmup=3, good=20, bad=16)  # measures 18, then 17 or 19  # doctest: +SKIP
        """
        out = []
        while good - bad > 1:
            mid = (good + bad) // 2
            result = self.measure(ForecastConfig(order=order, warmup=warmup, full_steps=mid))
            if result is None:
                break
            out.append(result)
            good, bad = (mid, bad) if self.meets(result) else (good, mid)
        return out

    def taylor(self, steps: int, order: int, warmup: int | None = None,
               below: int | None = None) -> list[dict[str, Any]]:
        """The ``taylor`` ladder at ``order`` and ``warmup``, refined by :meth:`bisect` where it stopped; only its
        rungs with fewer than ``below`` full steps (default ``steps``: all), the ones that can beat a choice at
        ``below``."""
        below = steps if below is None else below
        rungs = self.ladder(c for c in taylor_ladder(steps, order, warmup) if c.full_steps < below)
        if not rungs or self.meets(rungs[-1]):
            return rungs
        good = rungs[-2]["config"]["full_steps"] if len(rungs) > 1 else below
        last = rungs[-1]["config"]
        return rungs + self.bisect(order, last["warmup"], good, last["full_steps"])

    def speca_configs(self, beta: float) -> list[SpecaConfig]:
        """``speca`` at ``beta``, strictest ``tau0`` first, over the range its probe run's verifier errors span."""
        probe = self.measure(probe_config(SpecaConfig()))  # a measurement only, never a candidate
        errors = probe.get("checked_errors") if probe else None
        if not errors:
            return []
        return [SpecaConfig(tau0=t, beta=beta, tau_min=0.0) for t in tau_grid(errors, SPECA_TAUS)]

    def search(self, prune: bool = True) -> list[dict[str, Any]]:
        """Measure what the floor needs; returns every measurement considered. With ``prune``, a ``taylor`` ladder
        measures only the rungs with fewer full steps than the fewest that met the floor in the ladders before it."""
        try:
            results = [r for c in EXACT_CANDIDATES if (r := self.measure(c)) is not None]
            if self.floor is None:
                return results
            steps = int(self.samples[0]["num_inference_steps"])
            fewest = steps
            for warmup in taylor_warmups(steps):
                for order in TAYLOR_ORDERS:
                    found = self.taylor(steps, order, warmup, below=fewest if prune else None)
                    fewest = min([fewest, *(r["config"]["full_steps"] for r in found if self.meets(r))])
                    results += found
            for beta in SPECA_BETAS:
                results += self.ladder(self.speca_configs(beta))
            return results
        finally:
            self._bar.close()


def worst_psnr(result: dict[str, Any]) -> float:
    """The PSNR a relaxed measurement is judged on: its lower prediction bound (see the module docs)."""
    return result["psnr_bound"]


def ranked(results: list[dict[str, Any]], floor: float | None) -> list[dict[str, Any]]:
    """The measurements whose prediction bound meets ``floor`` (exact ones always do) and that make fewer calls than
    the plain loop, fewest calls first, one of each set of identical runs. Not the mean: the floor must hold on items
    it was not tuned on.

    Example:
        >>> runs = [{"method": "taylor", "exact": False, "psnr": 35.0, "psnr_bound": 33.0, "speedup": 2.0},
        ...         {"method": "taylor", "exact": False, "psnr": 35.0, "psnr_bound": 30.0, "speedup": 3.0},
        ...         {"method": "taylor", "exact": False, "psnr": 28.0, "psnr_bound": 27.0, "speedup": 4.0}]
        >>> [r["speedup"] for r in ranked(runs, 32.0)], [r["speedup"] for r in ranked(runs, 26.0)], ranked(runs, 40.0)
        ([2.0], [4.0, 3.0, 2.0], [])
    """
    ok = [r for r in results if r["speedup"] > 1.0 and (r["exact"] or (floor is not None and worst_psnr(r) >= floor))]
    ok.sort(key=lambda r: (r["speedup"], r["exact"], -r.get("evals", 0.0), r["psnr"] or 100.0), reverse=True)
    seen, out = set(), []
    for r in ok:  # one of identical runs: a knob that changed nothing (speca's beta when no forecast was refused)
        run = (r["method"], r["speedup"], r.get("evals"), r["psnr"], r.get("psnr_samples") and tuple(r["psnr_samples"]))
        if run not in seen:
            seen.add(run)
            out.append(r)
    return out


def best_reachable(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The relaxed measurement with the highest prediction bound (ties: faster), for a floor no candidate meets."""
    relaxed = [r for r in results if not r["exact"]]
    return max(relaxed, key=lambda r: (worst_psnr(r), r["speedup"]), default=None)
