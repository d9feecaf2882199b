"""Interleaved, synchronized timing of benchmark arms, and the machine block of the JSON."""

from __future__ import annotations

import platform
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..progress import progress


@dataclass
class Arm:
    """One side of a comparison: ``enable()``, then ``run(seeds)`` (timed), then ``disable()``.

    Attributes:
        name: method name in the JSON (``baseline``, ``taylor``, ``diffusers-taylorseer``...).
        run: generates the workload for the given seeds and returns the outputs (a tensor).
        enable / disable: attach and detach the method (outside the timed region).
        peer: True for the tools users would use instead (diffusers caches, fewer steps).
        config: the method's settings, recorded as given.
        stats: extra per-arm numbers filled by the suite (e.g. the method's own ``SpecStats``).
    """

    name: str
    run: Callable[[list[int]], torch.Tensor]
    enable: Callable[[], None] = lambda: None
    disable: Callable[[], None] = lambda: None
    peer: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    peak_mem_gb: float | None = None


def synchronize(device: torch.device | str) -> None:
    """Wait for queued kernels (CUDA), so a timer reads finished work."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_arms(arms: list[Arm], seeds: list[int], *, device: torch.device | str, repeats: int, warmup: int,
              show_progress: bool = True, count_compiles: bool = False) -> None:
    """Run every arm ``warmup`` times untimed, then ``repeats`` rounds, interleaving the arms each round.

    The order of the arms rotates between rounds so that no arm always runs first (cache, clocks).
    Fills ``arm.times`` (seconds) and, on CUDA, ``arm.peak_mem_gb``. ``count_compiles``: also
    ``arm.stats["compiled_graphs"] = {"warmup": n, "after_warmup": m}`` (graphs dynamo compiled
    during the arm's warmup runs and during its timed runs; ``after_warmup`` should be 0), after
    untimed all-arm rounds that settle the graphs arm switches need (``"settle"``, see :func:`_settle`).
    """
    from .compiled import graphs_compiled

    cuda = torch.device(device).type == "cuda"
    total = len(arms) * (warmup + repeats)
    with progress(total=total, desc="bench", disable=not show_progress) as bar:
        for arm in arms:
            arm.times.clear()
            arm.enable()
            before = graphs_compiled()
            try:
                for _ in range(warmup):
                    arm.run(seeds)
                    bar.update()
            finally:
                arm.disable()
            if count_compiles:
                arm.stats["compiled_graphs"] = {"warmup": graphs_compiled() - before, "after_warmup": 0}
        if count_compiles:
            _settle(arms, seeds, graphs_compiled)
        for r in range(repeats):
            for arm in arms[r % len(arms):] + arms[: r % len(arms)]:
                arm.enable()
                try:
                    if cuda:
                        torch.cuda.reset_peak_memory_stats(device)
                        base = torch.cuda.memory_allocated(device)
                    synchronize(device)
                    before = graphs_compiled()
                    start = time.perf_counter()
                    arm.run(seeds)
                    synchronize(device)
                    arm.times.append(time.perf_counter() - start)
                    if count_compiles:
                        arm.stats["compiled_graphs"]["after_warmup"] += graphs_compiled() - before
                    if cuda:
                        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30
                        arm.peak_mem_gb = max(arm.peak_mem_gb or 0.0, round(peak, 3))
                finally:
                    arm.disable()
                bar.update()
    if count_compiles:
        for arm in arms:
            graphs = arm.stats["compiled_graphs"]
            graphs["timing_valid"] = graphs["after_warmup"] == 0
            if not graphs["timing_valid"]:
                warnings.warn(f"bench: arm {arm.name!r} compiled {graphs['after_warmup']} graph(s) during its timed "
                              "runs: its time includes compilation (compiled_graphs.timing_valid = false)",
                              stacklevel=2)


SETTLE_ROUNDS = 3
"""Most untimed all-arm rounds run after the warmups under ``--compile`` until one compiles nothing."""


def _settle(arms: list[Arm], seeds: list[int], graphs_compiled: Callable[[], int]) -> None:
    """Untimed rounds over every arm, in turn, until a round compiles no graph (at most ``SETTLE_ROUNDS``).

    Switching arms changes the hooks on the compiled modules, and dynamo may recompile the first time it
    sees a module state again after another arm's (an arm's own warmup runs only its state): these
    rounds pay for every such graph before the timed rounds. Records ``compiled_graphs["settle"]``.
    """
    for arm in arms:
        arm.stats["compiled_graphs"]["settle"] = 0
    for _ in range(SETTLE_ROUNDS):
        compiled = 0
        for arm in arms:
            arm.enable()
            before = graphs_compiled()
            try:
                arm.run(seeds)
            finally:
                arm.disable()
            n = graphs_compiled() - before
            arm.stats["compiled_graphs"]["settle"] += n
            compiled += n
        if not compiled:
            return


def latency_summary(times: list[float]) -> dict[str, float | int]:
    """``{"median", "min", "max", "n"}`` of a list of seconds."""
    if not times:
        raise ValueError("no timings recorded")
    return {"median": round(statistics.median(times), 5), "min": round(min(times), 5),
            "max": round(max(times), 5), "n": len(times)}


def machine_info(device: torch.device | str) -> dict[str, Any]:
    """Device name and library versions for the JSON ``machine`` block."""
    import diffusers

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {"device": name, "device_type": device.type, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "platform": platform.platform()}
