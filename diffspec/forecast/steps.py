"""Reading steps, CFG branches and new generations from the ``timestep`` a transformer receives."""

from __future__ import annotations

from typing import Any

import torch


class StepTracker:
    """Turns the sequence of ``timestep`` values a transformer sees into (step, branch)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.step = -1
        self.branch = 0
        self.t_step: float | None = None

    def observe(self, t: float) -> bool:
        """Advance on a new call; returns True when a new generation starts."""
        new_generation = self.t_step is None or t > self.t_step
        if new_generation:
            self.step, self.branch = 0, 0
        elif t == self.t_step:
            self.branch += 1
        else:
            self.step, self.branch = self.step + 1, 0
        self.t_step = t
        return new_generation


def timestep_value(timestep: Any) -> float:
    """The scalar value of a ``timestep`` argument (first element of a tensor; one host read)."""
    if isinstance(timestep, torch.Tensor):
        return float(timestep.reshape(-1)[0].item())
    if timestep is None:
        raise ValueError("the transformer was called without a `timestep` argument; forecasting needs it")
    return float(timestep)


