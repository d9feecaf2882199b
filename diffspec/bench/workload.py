"""What a suite measures: a workload (one timed generation) and the untimed passes over it."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..config import ForecastConfig
from ..metrics import psnr
from ..progress import progress
from .counting import ComputeCounter
from .timing import Arm


class Workload:
    """What one timed run generates, and how to build each arm on it."""

    name: str
    mode: str
    transformer: torch.nn.Module
    steps: int
    batch: int
    seeds: list[int]

    def generate(self, seeds: list[int], steps: int | None = None) -> torch.Tensor:
        raise NotImplementedError

    def method_arm(self, method: str, config: ForecastConfig) -> Arm:
        raise NotImplementedError

    def quality_seeds(self, n: int) -> list[int]:
        return list(range(1000, 1000 + n))

    def quality(self, images: torch.Tensor, reference: torch.Tensor, seeds: list[int]) -> dict[str, Any]:
        return {"psnr": psnr(images, reference), "ssim": None, "lpips": None, "fid": None, "accuracy": None}

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


def count_compute(workload: Workload, arm: Arm, seeds: list[int] | None = None) -> tuple[list[int], torch.Tensor]:
    """One untimed run (of the timed seeds, or ``seeds``) with the compute counter; returns per-call units, output."""
    controlnet = getattr(workload, "controlnet", None)  # counted apart, into arm.stats["controlnet_per_call"]
    side = (ComputeCounter(controlnet, [controlnet.transformer_blocks, controlnet.single_transformer_blocks])
            if controlnet is not None else contextlib.nullcontext())
    arm.enable()
    try:
        with ComputeCounter(workload.transformer) as counter, side as side_counter:
            out = arm.run(workload.seeds if seeds is None else seeds)
    finally:
        arm.disable()
    if side_counter is not None:
        arm.stats["controlnet_per_call"] = list(side_counter.per_call)
    return list(counter.per_call), out


def generate_quality_set(workload: Workload, arm: Arm, n: int, chunk: int, show_progress: bool = True) -> torch.Tensor:
    """``n`` samples (fixed seeds, same for every arm) generated with the arm enabled."""
    seeds = workload.quality_seeds(n)
    starts = progress(range(0, len(seeds), chunk), desc=f"quality {arm.name}", disable=not show_progress)
    arm.enable()
    try:
        return torch.cat([arm.run(seeds[i : i + chunk]) for i in starts])
    finally:
        arm.disable()
