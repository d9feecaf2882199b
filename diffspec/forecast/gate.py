"""The SpecA gate: when a step runs in full, and how far a drafted block output is from the true one.

:class:`Schedule` holds the run-length rules (warmup, ``k_min`` / ``k_max``, last step full) per
batch row; :func:`verify_error` is the verifier's per-row metric. The threshold schedule
``tau(p)`` itself lives on :class:`~diffspec.config.SpecaConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from .. import kernels
from ..config import ForecastConfig, SpecaConfig
from .schedule_search import even_schedule


@dataclass(frozen=True)
class Schedule:
    """When a step runs in full, per batch row.

    A step is full during ``warmup``, at the last step (``last_step_full``), for a row that has
    no anchors yet, and when ``k_max`` steps have passed since the row's last full step. Other
    steps are drafts; with ``verify``, a draft is checked once ``k_min`` drafts ran in a row.
    ``taylor`` is the schedule without verification (``k_max = interval``). With ``fixed`` (``speca``'s
    replay mode) exactly those steps are full, plus any step where a row has no anchor yet. ``spread``
    (``taylor``'s ``full_steps``) becomes such a fixed set, spread evenly, in :meth:`for_steps`.
    """

    warmup: int
    k_max: int
    last_step_full: bool = True
    k_min: int = 0
    verify: bool = False
    fixed: frozenset[int] | None = None
    spread: int | None = None

    @classmethod
    def of(cls, config: ForecastConfig | SpecaConfig) -> Schedule:
        if isinstance(config, SpecaConfig) and config.replay_steps is not None:
            return cls(config.warmup, config.k_max, config.last_step_full, fixed=frozenset(config.replay_steps))
        if isinstance(config, SpecaConfig):
            verify = not math.isinf(config.tau(0.0))
            return cls(config.warmup, config.k_max, config.last_step_full, config.k_min, verify)
        return cls(config.warmup, config.interval, config.last_step_full, spread=config.full_steps)

    def for_steps(self, num_steps: int | None) -> Schedule:
        """This schedule for a generation of ``num_steps`` steps: ``spread`` placed as fixed full steps.

        Raises:
            ValueError: ``spread`` with an unknown step count, or more full steps than the generation has.
        """
        if self.spread is None:
            return self
        if num_steps is None:
            raise ValueError(f"full_steps={self.spread} needs the generation's step count, which this pipeline does "
                             "not expose (its scheduler has no `timesteps`); use interval instead")
        if not self.warmup < self.spread <= num_steps:
            raise ValueError(f"full_steps={self.spread} (warmup={self.warmup}) does not fit a generation of "
                             f"{num_steps} steps; allowed [{self.warmup + 1}, {num_steps}]")
        return replace(self, fixed=_spread(self.spread, num_steps, self.warmup), spread=None)

    def forced_full(self, step: int, num_steps: int | None, since_full: int | None, first_step: int = 0) -> bool:
        """Full regardless of the verifier (``since_full``: drafts since the row's last full step; ``first_step``:
        the step this transformer was first called at in the generation, where its warmup starts: Wan 2.2's
        low-noise expert takes over mid-generation)."""
        if since_full is None:
            return True
        if self.fixed is not None:
            return step in self.fixed
        if step - first_step < self.warmup:
            return True
        if self.last_step_full and num_steps is not None and step >= num_steps - 1:
            return True
        return since_full + 1 >= self.k_max

    def check_steps(self, num_steps: int | None) -> None:
        """Raise ``ValueError`` when a replayed schedule names steps that a generation of ``num_steps`` lacks."""
        if self.fixed is not None and num_steps is not None and max(self.fixed, default=-1) >= num_steps:
            raise ValueError(f"replay_steps reach step {max(self.fixed)} but this generation has {num_steps} steps "
                             f"(indices 0..{num_steps - 1}); pass a schedule made for {num_steps} steps")

    def checked(self, since_full: int | None) -> bool:
        return self.verify and since_full is not None and since_full >= self.k_min

    def without_rejections(self, num_steps: int) -> list[bool]:
        """Which steps are full when no draft is rejected (``taylor``'s fixed schedule)."""
        full, since = [], None
        for step in range(num_steps):
            full.append(self.forced_full(step, num_steps, since))
            since = 0 if full[-1] else since + 1  # type: ignore[operator]
        return full


@lru_cache(maxsize=64)
def _spread(n_full: int, num_steps: int, warmup: int) -> frozenset[int]:
    return frozenset(even_schedule(n_full, num_steps, warmup))


def verify_error(draft: torch.Tensor, true: torch.Tensor, metric: str = "rel_l1",
                 block_input: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row distance of a drafted block output to the true one (fp32, ``inf`` where not finite).

    ``"rel_l1"``: ``||draft - true||_1 / ||true||_1``; ``"rel_res"``: the same relative to the
    block's own residual ``true - block_input``; ``"rel_l1_mean"``: the reference code's mean of
    ``|draft - true| / (|true| + 1e-6)``.
    """
    if metric in ("rel_l1", "rel_res"):  # one fused pass: diffspec.kernels.l1_error
        num, den = kernels.l1_error(draft, true, block_input if metric == "rel_res" else None)
        e = num / den.clamp_min(1e-12)
    else:
        d, y = draft.float() - true.float(), true.float()
        e = (d.abs() / (y.abs() + 1e-6)).mean(tuple(range(1, d.dim())))
    return torch.where(torch.isfinite(e), e, torch.full_like(e, math.inf))


def decide_rows(errors: torch.Tensor, check_rows: list[bool], recompute: list[bool], force_full: list[bool],
                tau: float, strict: bool, stats_extra: dict, step: float) -> list[float]:
    """Apply the verifier's per-row errors (one host read): mark rows to recompute now (non-finite,
    or rejected under ``strict``) in ``recompute``, rows whose next step must be full (rejected,
    ``lazy``) in ``force_full``, and count checks / rejections in ``stats_extra``. Returns the
    checked rows' errors.
    """
    values = errors.tolist()
    checked = [e for e, c in zip(values, check_rows) if c]
    rejected_rows = 0
    for r, e in enumerate(values):
        if recompute[r]:
            continue
        rejected = check_rows[r] and e >= tau
        rejected_rows += rejected
        if not math.isfinite(e) or (rejected and strict):
            recompute[r] = True
        elif rejected:
            force_full[r] = True
    stats_extra["checks"] = stats_extra.get("checks", 0) + len(checked)
    stats_extra["rejections"] = stats_extra.get("rejections", 0) + rejected_rows
    if checked:
        stats_extra.setdefault("checked_errors", []).append([step, round(max(checked), 6), round(tau, 6)])
    return checked


def anchor_pairs(split: bool, single: bool, inputs: dict, tail_inputs: dict, outputs: dict) -> list[tuple[str, dict, dict]]:
    """``(head, inputs, outputs)`` whose residuals a full step records for one block list.

    An unverified list records its whole residual (``"list"``); the verified list records the last
    block alone (``"tail"``) and, unless it is the only block, the rest (``"body"``: list input to the
    last block's input).
    """
    if not split:
        return [("list", inputs, outputs)]
    pairs = [("tail", tail_inputs, outputs)]
    if not single:
        pairs.append(("body", inputs, tail_inputs))
    return pairs
