"""SpecStats: what every diffspec run reports."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    """Counters of one generation call (reset at the start of each call).

    Attributes:
        method: the method name (``"taylor"``, ...).
        target_calls: sequential full-model evaluations (every block ran).
        target_evals: total full-model evaluations, counting rows batched in parallel.
        draft_calls: draft / forecast evaluations (no transformer block ran for ``taylor``).
        accepted: drafts accepted (forecast methods: forecast steps committed).
        proposed: drafts proposed.
        wall_s: wall-clock seconds of the last call (CUDA synchronised at the end).
        full_steps: denoising steps computed in full (counted per transformer call, so a
            pipeline with separate CFG calls counts each branch).
        forecast_steps: denoising steps whose block outputs were forecast.
        extra_mem_gb: peak memory held by the method's caches (GB).
        extra: method-specific values. ``speca``: ``checks`` and ``rejections`` (batch rows),
            ``verifier_blocks`` (verifier block calls), ``verifier_evals`` (their work in full-step
            equivalents, per row) and ``checked_errors`` ([step, largest error, threshold] per check).

    Example:
        >>> s = SpecStats(method="taylor", full_steps=10, forecast_steps=40)
        >>> round(s.forecast_fraction, 2)
        0.8
    """

    method: str = ""
    target_calls: int = 0
    target_evals: int = 0
    draft_calls: int = 0
    accepted: int = 0
    proposed: int = 0
    wall_s: float = 0.0
    full_steps: int = 0
    forecast_steps: int = 0
    extra_mem_gb: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        """``accepted / proposed`` (0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def forecast_fraction(self) -> float:
        """Share of steps that were forecast rather than computed."""
        total = self.full_steps + self.forecast_steps
        return self.forecast_steps / total if total else 0.0

    def reset(self) -> None:
        """Zero every counter, keeping ``method``."""
        method = self.method
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default_factory() if callable(f.default_factory) else f.default)
        self.method = method

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable view, including the derived rates."""
        d = dataclasses.asdict(self)
        d["acceptance_rate"] = self.acceptance_rate
        d["forecast_fraction"] = self.forecast_fraction
        return d
