"""Block forecasting (``taylor``) and verified forecasting (``speca``) on ComfyUI DiT models.

ComfyUI lets a node replace any transformer block of the DiT families whose forward looks up
``transformer_options["patches_replace"]["dit"][(kind, i)]`` (Flux, Chroma, SD3, HunyuanVideo, Wan,
Qwen-Image, LTXV, Mochi, AuraFlow...). A replacement receives the block's inputs as a dict (``img``,
``txt``, ``vec``, ``pe``...) plus ``{"original_block": f}`` and returns a dict of the streams its caller
reads (``img``, and ``txt`` for double blocks).

:class:`ComfyForecast` drives the forecast engine of the diffusers path (:mod:`diffspec.forecast.engine`:
the same anchors, plans, block steps, verifier and statistics) from ComfyUI's side:
- steps come from ComfyUI's own schedule: the call's sigma located in
  ``transformer_options["sample_sigmas"]``; CFG branches are the ``uuids`` of the batched conds;
  a generation is one ``OUTER_SAMPLE`` run (:meth:`ComfyForecast.begin_run` / ``end_run``);
- ComfyUI's blocks update their inputs in place (Flux: ``img += ...``), so the stream inputs a
  residual or the verifier needs are copied before the block runs (:class:`DictStreams`), and anchors are
  recorded at once; what the model adds between blocks (ControlNet residuals: Flux's ``img += control``) is
  not added again on a draft, whose forecast carries it;
- the verifier block and the recompute run on the whole batch (ComfyUI block arguments cannot be
  sliced per row generically) and only the rows that need them are committed, so a row's output still
  never depends on its batch neighbours; the counters report the work actually done.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..config import ForecastConfig, SpecaConfig
from ..forecast.engine import ForecastCall, ForecastEngine
from ..forecast.rows import merge_rows
from ..stats import SpecStats

if TYPE_CHECKING:
    from .patching import BlockPatch

logger = logging.getLogger("diffspec")


class DictStreams:
    """The streams of a ComfyUI block (:class:`~diffspec.forecast.engine.StreamIO`): called as
    ``block(args, extra)``, it takes its streams in ``args`` and returns them as a dict. The stream names are
    learnt from its first output (``img`` first, the verifier's reference); inputs are copied, since the
    blocks update them in place."""

    whole_batch = True  # its other arguments cannot be sliced per row generically

    def __init__(self) -> None:
        self.keys: tuple[str, ...] = ()

    def inputs(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        return _snapshot(args[0], self.keys)

    def earlier_inputs(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        return {}

    def streams(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        return {k: args[0].get(k) for k in self.keys}

    def outputs(self, out: dict) -> dict[str, Any]:
        self.observe(out)
        return out

    def observe(self, out: dict) -> None:
        if not self.keys:
            self.keys = tuple(sorted(out, key=lambda k: k != "img"))

    def pack(self, streams: dict[str, Any]) -> dict[str, Any]:
        return streams

    def run_rows(self, run: Callable[..., Any], args: tuple, kwargs: dict, replace: dict[str, Any] | None,
                 rows: torch.Tensor, batch: int) -> dict[str, Any]:
        """The block run on every row (on copies of ``replace``'d streams); the rows ``rows`` of its output."""
        inputs, extra = args
        out = run({**inputs, **_snapshot(replace or {}, ())}, extra)
        return {k: v.index_select(0, rows.to(v.device, non_blocking=True)) if isinstance(v, torch.Tensor) else v
                for k, v in out.items()}


class ComfyForecast(ForecastEngine):
    """State and statistics of one forecast-patched ComfyUI MODEL.

    The block patches (one per replaced block) and the sampling wrappers of
    :mod:`diffspec.comfyui.patching` all refer to one instance. ``deepcopy`` returns the instance
    itself, so clones of the patched MODEL (``ModelPatcher.clone`` deep-copies ``model_options``)
    share it: the statistics are those of the latest run, and state never outlives a run.

    Args:
        config: a :class:`ForecastConfig` (``taylor``) or :class:`SpecaConfig` (``speca``);
            block granularity only.
        block_lists: ``(kind, number of blocks)`` per block list in execution order, e.g.
            ``[("double_block", 19), ("single_block", 38)]`` for Flux.

    Example:
        >>> fc = ComfyForecast(ForecastConfig(interval=4), [("double_block", 2), ("single_block", 3)])
        >>> fc.stats.method
        'taylor'
    """

    defer_records = False
    """ComfyUI's model adds to a block's outputs in place after it returns: anchors are recorded at once."""

    discard_between_blocks = True
    """A draft's last block of a list takes the stream its first block drafted: what the model adds between the
    blocks of a list (ControlNet residuals) is in the list's forecast residual already (False: added again)."""

    def __init__(self, config: ForecastConfig | SpecaConfig, block_lists: list[tuple[str, int]]) -> None:
        if not isinstance(config, (ForecastConfig, SpecaConfig)):
            raise TypeError(f"config must be a ForecastConfig or SpecaConfig, got {type(config).__name__}")
        if config.granularity != "block":
            raise ValueError(f"granularity={config.granularity!r}: ComfyUI models are forecast per block list only; "
                             "use granularity='block'")
        if not block_lists or any(n < 1 for _, n in block_lists):
            raise ValueError(f"block_lists={block_lists!r} must name at least one non-empty block list")
        super().__init__(config, SpecStats(method=config.method), [n for _, n in block_lists])
        self.block_lists = list(block_lists)
        self.runs = 0
        self.disabled: str | None = None
        self._reset_state()

    def __deepcopy__(self, memo: dict) -> ComfyForecast:
        return self

    # ----------------------------------------------------------------- runs
    def _reset_state(self) -> None:
        self.branches = {}
        self.call = None
        self._sigmas: list[float] | None = None
        self._sigmas_src: Any = None
        self._last_sigma: float | None = None
        self._calls_at_sigma = 0
        self._free_step = -1
        self._in_run = False
        self._peak_bytes = 0

    def begin_run(self, sigmas: torch.Tensor | None = None) -> None:
        """Start a generation (ComfyUI ``OUTER_SAMPLE``): forget all state, zero the statistics."""
        self._reset_state()
        self.stats.reset()
        self.disabled = None
        if sigmas is not None:
            self._set_sigmas(sigmas)
        self._in_run = True
        self.runs += 1

    def end_run(self, wall_s: float | None = None) -> None:
        """End a generation: drop every anchor (the statistics stay readable) and log a summary."""
        if wall_s is not None:
            self.stats.wall_s = wall_s
        self._reset_state()
        logger.info(self.summary())

    @property
    def num_anchors_held(self) -> int:
        """Forecasters currently holding anchors (0 outside a run)."""
        return sum(bool(f.num_anchors) for b in self.branches.values() for ls in b.lists for f in ls.forecasters.values())

    def summary(self) -> str:
        """One line for logs and the stats node."""
        s = self.stats
        line = (f"diffspec {s.method}: full_steps {s.full_steps:g}, forecast_steps {s.forecast_steps:g} "
                f"({100 * s.forecast_fraction:.0f}% forecast), target_calls {s.target_calls}")
        if self.verify:
            line += f", checks {s.extra.get('checks', 0)}, rejections {s.extra.get('rejections', 0)}"
        line += f", cache {s.extra_mem_gb:.3f} GB, {s.wall_s:.2f} s"
        return line + (f" [disabled: {self.disabled}]" if self.disabled else "")

    # ----------------------------------------------------------------- steps and branches
    def _set_sigmas(self, sigmas: Any) -> None:
        if sigmas is self._sigmas_src:
            return
        self._sigmas_src = sigmas
        values = sigmas.detach().float().reshape(-1).cpu().tolist() if isinstance(sigmas, torch.Tensor) else sigmas
        self._sigmas = [float(v) for v in values]

    def _locate(self, sigma: float, transformer_options: dict) -> tuple[float, int | None]:
        """``(step, num_steps)``: the call's position in the run's sigma schedule (one host list per run)."""
        if transformer_options.get("sample_sigmas") is not None:
            self._set_sigmas(transformer_options["sample_sigmas"])
        s = self._sigmas
        if not s or len(s) < 2:  # no schedule: count distinct sigmas
            if sigma != self._last_sigma:
                self._free_step += 1
            return float(self._free_step), None
        n = len(s) - 1
        for i, v in enumerate(s):
            if math.isclose(v, sigma, rel_tol=1e-5, abs_tol=1e-8):
                return float(i), n
        for i in range(n):  # between two sigmas (multi-evaluation samplers)
            if min(s[i], s[i + 1]) < sigma < max(s[i], s[i + 1]):
                return i + (s[i] - sigma) / (s[i] - s[i + 1]), n
        return (0.0 if abs(sigma - s[0]) < abs(sigma - s[-1]) else float(n)), n

    def _branch_key(self, x: torch.Tensor, transformer_options: dict) -> Any:
        uuids = transformer_options.get("uuids")
        if uuids:
            return tuple(uuids), tuple(x.shape)
        return self._calls_at_sigma, tuple(x.shape)  # no uuids: the n-th call at this sigma

    def begin_call(self, x: torch.Tensor, t: torch.Tensor, transformer_options: dict) -> ForecastCall | None:
        """Plan a model call (``x``: the latent batch, ``t``: its sigmas); None when forecasting is off."""
        if self.disabled:
            return None
        sigma = float(t.reshape(-1)[0]) if isinstance(t, torch.Tensor) else float(t)  # the one host read
        if not self._in_run and self._last_sigma is not None and sigma > self._last_sigma:
            self._reset_state()  # no OUTER_SAMPLE around this call: a rising sigma starts a new generation
            self.stats.reset()
        self._calls_at_sigma = self._calls_at_sigma + 1 if sigma == self._last_sigma else 0
        step, num_steps = self._locate(sigma, transformer_options)
        self._last_sigma = sigma
        key = self._branch_key(x, transformer_options)
        branch = self.branches.get(key)
        if branch is None:
            branch = self.branches[key] = self._new_branch(x.shape[0])
        call = self._plan(branch, step, num_steps, sigma, self.schedule.for_steps(num_steps))
        call.residuals_between = self.discard_between_blocks
        return call

    def run_call(self, run: Callable[[], torch.Tensor], x: torch.Tensor, t: torch.Tensor,
                 transformer_options: dict) -> torch.Tensor:
        """Run one model call (``run()``: ComfyUI's ``apply_model``) under the plan, recomputing rows if needed."""
        call = self.begin_call(x, t, transformer_options)
        if call is None:
            return run()
        try:
            out = run()
            recompute = list(call.full_rows) if call.is_draft else [True] * len(call.full_rows)
            if call.is_draft:
                self._decide(recompute, round(call.step, 3))
                if any(recompute):  # planned-full rows and strict rejections: one full pass, commit those rows
                    call.mode = "full"
                    call.record_rows = None if all(recompute) else [r for r, f in enumerate(recompute) if f]
                    full = run()
                    if call.record_rows is None:
                        out = full
                    else:
                        index = torch.tensor(call.record_rows, device=full.device)
                        out = merge_rows(index, full.index_select(0, index), out)
            self._finish(recompute, 1)  # the whole batch ran in full
            if not call.is_draft and not all(ls.forecasters for ls in call.branch.lists):
                self._disable("a block list recorded no stream: this model does not call the ComfyUI 'dit' "
                              "block patches for every block list, or its blocks return no tensor streams")
        finally:
            self.call = None
        return out

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self.stats.extra["disabled"] = reason
        logger.warning("diffspec forecasting is off for this run: %s", reason)

    # ----------------------------------------------------------------- blocks
    def block(self, patch: BlockPatch, args: dict, extra: dict) -> dict:
        """One replaced block call under the current plan (:meth:`~diffspec.forecast.engine.ForecastEngine.run_block`)."""
        if self.call is None:
            return patch.run(args, extra)
        return self.run_block(patch.at, patch.io, patch.run, (args, extra), {})


def _snapshot(args: dict, keys: tuple[str, ...]) -> dict[str, Any]:
    """Copies of the stream tensors among ``args`` (``keys``; every tensor while unknown).

    ComfyUI's blocks update their inputs in place (Flux: ``img += ...``), so a reference taken
    before a block runs would read its output afterwards.
    """
    return {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and (not keys or k in keys)}
