"""Block forecasting (``taylor``) and verified forecasting (``speca``) on ComfyUI DiT models.

ComfyUI lets a node replace any transformer block of the DiT families whose forward looks up
``transformer_options["patches_replace"]["dit"][(kind, i)]`` (Flux, Chroma, SD3, HunyuanVideo, Wan,
Qwen-Image, LTXV, Mochi, AuraFlow...). A replacement receives the block's inputs as a dict (``img``,
``txt``, ``vec``, ``pe``...) plus ``{"original_block": f}`` and returns a dict of the streams its caller
reads (``img``, and ``txt`` for double blocks).

This module is the ComfyUI twin of :mod:`diffspec.forecast.hooks` at block granularity, with the
same tensor core (:class:`~diffspec.forecast.taylor.TaylorForecaster`,
:class:`~diffspec.forecast.gate.Schedule`, :func:`~diffspec.forecast.gate.verify_error`) and the same
semantics: per batch row, a full step records the residual ``out - in`` of each block list and
stream; a draft step runs no block: the first block of a list returns ``in + forecast``, the others
pass their inputs through, and the last takes the stream its first block drafted, so what the model adds
between blocks (ControlNet residuals: Flux's ``img += control``) is not added again on top of the forecast,
which carries it. With ``speca`` the last list is split into its body and its last block,
which runs on the drafted input (the verifier); its true output is committed for the checked rows,
and rows whose draft fails are recomputed in full before anything is committed (``policy="strict"``).

Differences from the diffusers adapter, all ComfyUI-driven:
- steps come from ComfyUI's own schedule: the call's sigma located in
  ``transformer_options["sample_sigmas"]``; CFG branches are the ``uuids`` of the batched conds;
  a generation is one ``OUTER_SAMPLE`` run (:meth:`ComfyForecast.begin_run` / ``end_run``);
- ComfyUI's blocks update their inputs in place (Flux: ``img += ...``), so the stream inputs a
  residual or the verifier needs are copied before the block runs;
- the verifier block and the recompute run on the whole batch (ComfyUI block arguments cannot be
  sliced per row generically) and only the rows that need them are committed, so a row's output still
  never depends on its batch neighbours; the counters report the work actually done.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..config import ForecastConfig, SpecaConfig
from ..forecast.gate import Schedule, anchor_pairs, decide_rows, verify_error
from ..forecast.rows import merge_rows
from ..forecast.taylor import TaylorForecaster
from ..stats import SpecStats

if TYPE_CHECKING:
    from .patching import BlockPatch

logger = logging.getLogger("diffspec")


@dataclass
class _ListState:
    forecasters: dict[str, TaylorForecaster] = field(default_factory=dict)  # "list:img", "tail:txt"...
    inputs: dict[str, Any] = field(default_factory=dict)  # the list's first block arguments (full call)
    tail_inputs: dict[str, Any] = field(default_factory=dict)  # the verified last block's arguments
    out_keys: tuple[str, ...] = ()  # the streams the list's blocks return
    none_keys: frozenset[str] = frozenset()  # streams the last block returns as None (SD3's last block)
    drafted: dict[str, Any] | None = None  # a draft's streams as its first block returned them (copies)


@dataclass
class _Branch:
    lists: list[_ListState]
    since_full: list[int | None]  # per row: drafts since the last full step (None: never full)
    force_full: list[bool]  # per row: the lazy policy rejected the previous draft


@dataclass
class _Call:
    """The plan of one model call (one CFG branch at one step)."""

    branch: _Branch
    x: float  # forecast abscissa
    step: float  # position in the run's sigma schedule (fractional between its sigmas)
    progress: float
    full_rows: list[bool]
    check_rows: list[bool]
    mode: str  # "full" or "draft"
    run_verifier: bool = False
    record_rows: list[int] | None = None
    errors: torch.Tensor | None = None


class ComfyForecast:
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
        self.config = config
        self.block_lists = list(block_lists)
        self.schedule = Schedule.of(config)
        self.verify = self.schedule.verify
        self.num_blocks = sum(n for _, n in block_lists)
        self.stats = SpecStats(method=config.method)
        self.runs = 0
        self.disabled: str | None = None
        self.current: _Call | None = None
        self._reset_state()

    def __deepcopy__(self, memo: dict) -> ComfyForecast:
        return self

    # ----------------------------------------------------------------- runs
    def _reset_state(self) -> None:
        self._branches: dict[Any, _Branch] = {}
        self.current = None
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
        return sum(bool(f.num_anchors) for b in self._branches.values() for ls in b.lists for f in ls.forecasters.values())

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

    def _branch_key(self, x: torch.Tensor, transformer_options: dict, sigma: float) -> Any:
        uuids = transformer_options.get("uuids")
        if uuids:
            return tuple(uuids), tuple(x.shape)
        return self._calls_at_sigma, tuple(x.shape)  # no uuids: the n-th call at this sigma

    def begin_call(self, x: torch.Tensor, t: torch.Tensor, transformer_options: dict) -> _Call | None:
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
        key = self._branch_key(x, transformer_options, sigma)
        rows = x.shape[0]
        branch = self._branches.get(key)
        if branch is None:
            branch = _Branch([_ListState() for _ in self.block_lists], [None] * rows, [False] * rows)
            self._branches[key] = branch
        sched = self.schedule.for_steps(num_steps)
        full_rows = [sched.forced_full(step, num_steps, s) or f for s, f in zip(branch.since_full, branch.force_full)]  # type: ignore[arg-type]
        check_rows = [not f and sched.checked(s) for f, s in zip(full_rows, branch.since_full)]
        call = _Call(branch, sigma if self.config.abscissa == "sigma" else step, step,
                     step / max(num_steps - 1, 1) if num_steps else 0.0, full_rows, check_rows,
                     "full" if all(full_rows) else "draft")
        call.run_verifier = call.mode == "draft" and any(check_rows)
        return call

    def run_call(self, run: Callable[[], torch.Tensor], x: torch.Tensor, t: torch.Tensor,
                 transformer_options: dict) -> torch.Tensor:
        """Run one model call (``run()``: ComfyUI's ``apply_model``) under the plan, recomputing rows if needed."""
        call = self.begin_call(x, t, transformer_options)
        if call is None:
            return run()
        self.current = call
        try:
            out = run()
            drafted = call.mode == "draft"
            recompute = list(call.full_rows) if drafted else [True] * len(call.full_rows)
            if drafted:
                self._decide(call, recompute)
                if any(recompute):  # planned-full rows and strict rejections: one full pass, commit those rows
                    call.mode = "full"
                    call.record_rows = None if all(recompute) else [r for r, f in enumerate(recompute) if f]
                    full = run()
                    if call.record_rows is None:
                        out = full
                    else:
                        index = torch.tensor(call.record_rows, device=full.device)
                        out = merge_rows(index, full.index_select(0, index), out)
            self._finish(call, recompute, drafted)
        finally:
            self.current = None
        return out

    def _decide(self, call: _Call, recompute: list[bool]) -> None:
        """The verifier's per-row errors to recompute / lazy decisions (one host read)."""
        if not self.verify or call.errors is None:
            return
        tau = self.config.tau(call.progress)  # type: ignore[union-attr]
        decide_rows(call.errors, call.check_rows, recompute, call.branch.force_full, tau,
                    self.config.policy == "strict", self.stats.extra, round(call.step, 3))  # type: ignore[union-attr]

    def _finish(self, call: _Call, recompute: list[bool], drafted: bool) -> None:
        branch = call.branch
        for r, full in enumerate(recompute):
            since = branch.since_full[r]
            branch.since_full[r] = 0 if full else since + 1  # type: ignore[operator]
            if full:
                branch.force_full[r] = False
        stats = self.stats
        committed_drafts = recompute.count(False)
        stats.count_rows(recompute.count(True), len(recompute))
        if any(recompute):
            stats.target_calls += 1
            stats.target_evals += 1  # the whole batch ran in full
            held = sum(f.nbytes for b in self._branches.values() for ls in b.lists for f in ls.forecasters.values())
            self._peak_bytes = max(self._peak_bytes, held)
            stats.extra_mem_gb = self._peak_bytes / 1e9
            if not drafted and not all(ls.forecasters for ls in branch.lists):
                self._disable("a block list recorded no stream: this model does not call the ComfyUI 'dit' "
                              "block patches for every block list, or its blocks return no tensor streams")
        if drafted:
            stats.draft_calls += 1
            stats.proposed += call.full_rows.count(False)
            stats.accepted += committed_drafts

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self.stats.extra["disabled"] = reason
        logger.warning("diffspec forecasting is off for this run: %s", reason)

    # ----------------------------------------------------------------- blocks
    def block(self, patch: BlockPatch, args: dict, extra: dict) -> dict:
        """One replaced block call under the current plan (see the module docstring)."""
        call = self.current
        if call is None:
            return patch.run(args, extra)
        state = call.branch.lists[patch.list_index]
        first, last, split = patch.first, patch.last, patch.split
        if call.mode == "full":
            if first:
                state.inputs = _snapshot(args, state.out_keys)
            if last and split:
                state.tail_inputs = _snapshot(args, state.out_keys)
            out = patch.run(args, extra)
            if first and not state.out_keys:
                state.out_keys = tuple(out)
            if last:
                self._record(call, state, out, split=split, single=first)
            return out
        streams = {k: args.get(k) for k in state.out_keys}
        if first:
            head = "body" if split else "list"
            streams = {k: self._apply(call, state, f"{head}:{k}", v) for k, v in streams.items()}
            state.drafted = _snapshot(streams, ()) if self.discard_between_blocks and not last else None
        if not last:
            return streams
        if state.drafted is not None:  # what the model added inside the list is in the forecast already
            held, state.drafted = state.drafted, None
            streams = {k: held[k] if _same_shape(held.get(k), v) else v for k, v in streams.items()}
        if not split:
            return {k: None if k in state.none_keys else v for k, v in streams.items()}
        return self._verified_tail(call, state, patch, args, extra, streams)

    def _verified_tail(self, call: _Call, state: _ListState, patch: BlockPatch, args: dict, extra: dict,
                       streams: dict[str, Any]) -> dict:
        """The last block on a draft step: draft it; if a row is checked, run it for real on the drafted
        input, measure each checked row's error and commit the true output for those rows."""
        hats = {k: None if k in state.none_keys else self._apply(call, state, f"tail:{k}", v) for k, v in streams.items()}
        primary = "img" if isinstance(hats.get("img"), torch.Tensor) else next(
            k for k, v in hats.items() if isinstance(v, torch.Tensor))
        h_hat = hats[primary]
        if not call.run_verifier:
            call.errors = verify_error(h_hat, h_hat)  # 0, or inf for a row that is not finite
            return hats
        true = patch.run({**args, **_snapshot(streams, ())}, extra)  # whole batch; only checked rows are used
        rows = [r for r, c in enumerate(call.check_rows) if c]
        index = torch.tensor(rows, device=h_hat.device)
        errors = verify_error(h_hat.index_select(0, index), true[primary].index_select(0, index),
                              self.config.metric, streams[primary].index_select(0, index))  # type: ignore[union-attr]
        call.errors = verify_error(h_hat, h_hat).index_copy(0, index, errors)
        extra_stats = self.stats.extra
        extra_stats["verifier_blocks"] = extra_stats.get("verifier_blocks", 0) + 1
        extra_stats["verifier_evals"] = extra_stats.get("verifier_evals", 0.0) + 1 / self.num_blocks
        out = {}
        for k, v in hats.items():
            y = true.get(k)
            out[k] = v if v is None or not isinstance(y, torch.Tensor) else merge_rows(index, y.index_select(0, index), v)
        return out

    def _record(self, call: _Call, state: _ListState, out: dict, *, split: bool, single: bool) -> None:
        pairs = anchor_pairs(split, single, state.inputs, state.tail_inputs, out)
        for head, ins, outs in pairs:
            for k in state.out_keys:
                x_in, y = ins.get(k), outs.get(k)
                if not isinstance(x_in, torch.Tensor) or not isinstance(y, torch.Tensor) or y.shape != x_in.shape:
                    continue
                f = state.forecasters.get(f"{head}:{k}")
                if f is None:
                    f = state.forecasters[f"{head}:{k}"] = TaylorForecaster(self.config.order, self.config.form)
                f.update(call.x, y - x_in, call.record_rows)
        state.inputs, state.tail_inputs = {}, {}
        state.none_keys = frozenset(k for k, v in out.items() if v is None)

    def _apply(self, call: _Call, state: _ListState, key: str, x: Any) -> Any:
        f = state.forecasters.get(key)
        if not isinstance(x, torch.Tensor) or f is None:
            return x
        return (x.float() + f.forecast(call.x)).to(x.dtype)


def _same_shape(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape


def _snapshot(args: dict, keys: tuple[str, ...]) -> dict[str, Any]:
    """Copies of the stream tensors among ``args`` (``keys``; every tensor while unknown).

    ComfyUI's blocks update their inputs in place (Flux: ``img += ...``), so a reference taken
    before a block runs would read its output afterwards.
    """
    return {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and (not keys or k in keys)}
