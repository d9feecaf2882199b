"""SpecStats: what every diffspec run reports, each figure defined once (also in ``docs/stats.md``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    """Counters of one generation call (reset at the start of each call).

    Terms. A *target call* is one forward pass of the full target model (the transformer, the
    AR or multimodal model), whatever the number of rows it evaluates in parallel. A *row* is one
    image (one trajectory, one sequence) in one call; when a pipeline batches its CFG branches
    into one call (DiT, PixArt, SD3, Flux: ``torch.cat([latents] * 2)``), each branch of each
    image is a row of that call. A *branch* is one of the denoiser calls a step makes one after
    the other: 1 when CFG is batched into one call or off, 2 when the pipeline calls the denoiser
    once per CFG branch (Wan, Ideogram 4's unconditional transformer). ``speca`` decides row by
    row; fractional counts below are means over a call's rows.

    Attributes:
        method: the method name (``"taylor"``, ...).
        steps: steps of the generation: denoising steps (diffusion), tokens per image (AR image).
            0 where the method does not set it (multimodal: see ``extra``).
        branches: sequential denoiser calls per step (see above; 1 outside diffusion).
        target_calls: sequential target calls (each ran every block, on one row or many): what
            latency follows. The plain loop makes ``steps * branches`` of them (AR: the prefill
            gives the first token, so ``steps``).
        target_evals: full-model work, counting rows evaluated in parallel. Diffusion: per image
            and branch (a call adds the share of its rows it ran in full; ``coupling`` /
            ``autospec``: the rows of its calls, drafted steps included, per trajectory). AR
            image: calls x CFG branches. Multimodal: calls x batch rows.
        draft_calls: draft or forecast evaluations (``taylor``/``speca``: calls in which some row
            was forecast; no transformer block ran for those rows).
        accepted, proposed: drafts accepted and proposed. ``taylor``/``speca``: rows the schedule
            let forecast (``proposed``) and those committed (``accepted``; a ``speca`` rejection
            recomputes its row); ``coupling``/``autospec``: drafted steps up to the first rejection
            of each round; AR/multimodal: drafted tokens.
        full_steps: diffusion: steps whose denoiser output came from the full model, per image:
            a call adds the share of its rows computed in full (``coupling``/``autospec``: every
            step, evaluated in parallel rounds).
        forecast_steps: diffusion: steps whose output was forecast, per image, counted as
            ``full_steps``. ``full_steps + forecast_steps == steps * branches``.
        wall_s: wall-clock seconds of the last call (CUDA synchronised at the end).
        extra_mem_gb: peak memory held by the method's caches (GB).
        extra: method-specific values. ``speca``: ``checks`` and ``rejections`` (rows),
            ``verifier_blocks`` (verifier block calls), ``verifier_evals`` (their work in full-step
            equivalents, per row) and ``checked_errors`` ([step, largest error, threshold] per check).

    Derived: :attr:`acceptance_rate` (``accepted / proposed``), :attr:`forecast_fraction` and
    :attr:`speedup` (``steps * branches / target_calls``: the plain loop's sequential target calls
    over this run's).

    Example:
        >>> s = SpecStats(method="coupling", steps=50, target_calls=34, full_steps=50)
        >>> round(s.speedup, 2)
        1.47
        >>> round(SpecStats(method="taylor", steps=50, full_steps=10, forecast_steps=40).forecast_fraction, 2)
        0.8
    """

    method: str = ""
    steps: int = 0
    branches: int = 1
    target_calls: int = 0
    target_evals: float = 0
    draft_calls: int = 0
    accepted: int = 0
    proposed: int = 0
    wall_s: float = 0.0
    full_steps: float = 0
    forecast_steps: float = 0
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

    @property
    def speedup(self) -> float | None:
        """Estimated speedup over the plain loop: ``steps * branches / target_calls`` (None before a run, or
        where ``steps`` is not set). It counts sequential target calls, not their size or the draft's cost."""
        return self.steps * self.branches / self.target_calls if self.steps and self.target_calls else None

    def count_rows(self, full_rows: int, rows: int) -> None:
        """Count one denoiser call of ``rows`` rows, ``full_rows`` of them computed in full and the others forecast:
        each adds its share of the call to ``full_steps`` or ``forecast_steps``."""
        self.full_steps += full_rows / rows
        self.forecast_steps += (rows - full_rows) / rows

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
        d["speedup"] = self.speedup
        return d
