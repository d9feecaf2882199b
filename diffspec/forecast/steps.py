"""Reading steps, CFG branches and new generations from the ``timestep`` a transformer receives."""

from __future__ import annotations

from typing import Any

import torch

TIMESTEP_ARGS = ("timestep", "t", "timesteps")
"""Names of a transformer's timestep argument, first match in its signature wins (Z-Image: ``t``, HiDream:
``timesteps``)."""


class StepTracker:
    """Turns the sequence of ``timestep`` values a transformer sees into (step, branch).

    ``increasing``: the timestep grows during a generation (the pipeline passes ``1 - sigma``: the
    ``increasing_timesteps`` of the model's :class:`~.profiles.ModelProfile`). One tracker
    can be shared by the denoisers of a pipeline (Wan 2.2's two experts, Ideogram 4's conditional and
    unconditional transformers): their calls then count the pipeline's steps, and ``generation`` tells each
    of them that a new generation started, whichever of them saw it first.
    """

    def __init__(self, increasing: bool = False) -> None:
        self.increasing = increasing
        self.generation = 0  # bumped at each new generation (never reset)
        self.reset()

    def reset(self) -> None:
        self.step = -1
        self.branch = 0
        self.t_step: float | None = None
        self._read: tuple[torch.Tensor, int, float] | None = None  # (tensor, its version, value) last read

    def read(self, timestep: Any) -> float:
        """:func:`timestep_value`, without a second host read when the same, unmodified tensor comes
        again (pipelines that call the transformer once per CFG branch pass one ``timestep``)."""
        if not isinstance(timestep, torch.Tensor):
            return timestep_value(timestep)
        try:
            version = timestep._version
        except RuntimeError:  # inference-mode tensors have no version counter
            return timestep_value(timestep, self.increasing)
        last = self._read
        if last is not None and last[0] is timestep and last[1] == version:
            return last[2]
        value = timestep_value(timestep, self.increasing)
        self._read = (timestep, version, value)
        return value

    def observe(self, t: float) -> bool:
        """Advance on a new call; returns True when a new generation starts."""
        new_generation = self.t_step is None or (t < self.t_step if self.increasing else t > self.t_step)
        if new_generation:
            self.step, self.branch = 0, 0
            self.generation += 1
        elif t == self.t_step:
            self.branch += 1
        else:
            self.step, self.branch = self.step + 1, 0
        self.t_step = t
        return new_generation


def timestep_value(timestep: Any, increasing: bool = False) -> float:
    """The scalar value of a ``timestep`` argument (one host read).

    A tensor's noisiest entry: its max (its min where the timestep grows over a generation). Per-token
    timesteps (Wan 2.2 TI2V, LTX image-to-video) give the conditioning frame's tokens 0 (clean), so their
    first element would read 0 at every step.
    """
    if isinstance(timestep, torch.Tensor):
        return float((timestep.min() if increasing else timestep.max()).item())
    if timestep is None:
        raise ValueError("the transformer was called without a `timestep` argument; forecasting needs it")
    return float(timestep)


