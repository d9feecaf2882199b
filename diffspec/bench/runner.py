"""Runs a list of arms on one workload: counting, interleaved timing, quality; returns JSON runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .timing import Arm, latency_summary, time_arms
from .workload import Workload, count_compute, generate_quality_set


def arm_stats(arm: Arm) -> dict[str, Any] | None:
    """The method's own ``SpecStats`` after its last run (None for baseline and peers)."""
    spec = getattr(arm, "spec", None)
    stats = spec.stats if spec is not None else getattr(arm, "stats_obj", None)
    if stats is None:
        return None
    d = stats.to_dict()
    d.pop("wall_s", None)
    return d


@torch.inference_mode()
def run_arms(workload: Workload, arms: list[Arm], *, device: torch.device, repeats: int, warmup: int,
             quality_samples: int, quality_chunk: int, show_progress: bool = True,
             untimed: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
             count_compiles: bool = False) -> list[dict[str, Any]]:
    """Measure every arm; the first arm is the baseline the others are compared with.

    ``untimed``: a context the counting and quality passes run in (e.g. eager under ``--compile``);
    ``count_compiles``: record graphs compiled per arm in warmup and after it (see :func:`time_arms`).
    """
    untimed = untimed or contextlib.nullcontext
    counts: dict[str, list[int]] = {}
    outputs: dict[str, torch.Tensor] = {}
    stats: dict[str, Any] = {}
    with untimed():
        for arm in arms:
            counts[arm.name], outputs[arm.name] = count_compute(workload, arm)
            stats[arm.name] = arm_stats(arm)
    full_units = max(counts[arms[0].name])
    last: dict[str, torch.Tensor] = {}
    if count_compiles:  # keep each arm's last timed output, to compare with its eager counting output
        for arm in arms:
            arm.run = _keep_last(arm.name, arm.run, last)

    time_arms(arms, workload.seeds, device=device, repeats=repeats, warmup=warmup, show_progress=show_progress,
              count_compiles=count_compiles)

    if workload.mode == "pipeline":
        with untimed():
            samples = {arm.name: generate_quality_set(workload, arm, quality_samples, quality_chunk, show_progress)
                       for arm in arms}
        seeds = workload.quality_seeds(quality_samples)
    else:
        samples, seeds = outputs, workload.seeds
    reference = samples[arms[0].name]
    base_median = latency_summary(arms[0].times)["median"]

    runs = []
    for arm in arms:
        latency = latency_summary(arm.times)
        quality = workload.quality(samples[arm.name], reference, seeds)
        quality["exact"] = bool(torch.equal(samples[arm.name], reference))
        per_call = counts[arm.name]
        run = {"method": arm.name, "peer": arm.peer, "config": arm.config, "latency_s": latency,
               "target_calls": sum(1 for u in per_call if u >= full_units),
               "transformer_calls": len(per_call),
               "target_evals": round(sum(per_call) / full_units, 3),
               "peak_mem_gb": arm.peak_mem_gb,
               "speedup_vs_baseline": round(base_median / latency["median"], 3), "quality": quality}
        if stats[arm.name] is not None:
            run["stats"] = stats[arm.name]
        if "controlnet_per_call" in arm.stats:  # a ControlNet called before the transformer each step
            units, full = arm.stats["controlnet_per_call"], max(arms[0].stats["controlnet_per_call"])
            run["controlnet_calls"] = sum(1 for u in units if u >= full)
            run["controlnet_evals"] = round(sum(units) / full, 3)
        if "compiled_graphs" in arm.stats:
            run["compiled_graphs"] = arm.stats["compiled_graphs"]
        if arm.name in last:
            run["compiled_vs_eager_max_abs"] = float((last[arm.name].float() - outputs[arm.name].float()).abs().max())
        runs.append(run)
    return runs


def _keep_last(name: str, run: Callable[[list[int]], torch.Tensor],
               last: dict[str, torch.Tensor]) -> Callable[[list[int]], torch.Tensor]:
    def kept(seeds: list[int]) -> torch.Tensor:
        last[name] = out = run(seeds)
        return out
    return kept
