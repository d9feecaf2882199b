"""The forecast engine: what a call does at each block, the same for diffusers and ComfyUI models.

Per CFG branch and batch row, a model call is planned full or draft (:class:`~.gate.Schedule`). A full
call runs every block and records, per block list and stream, the residual ``out - in`` as an anchor.
A draft call runs no block: the first block of a list returns ``in + forecast``, the others pass their
inputs through, and the last takes the stream its first block drafted where the model adds residuals
between blocks (they are in the forecast already). With a verifier (``speca``) the last list is split
into its body and its last block, which runs on the drafted input for the checked rows; its true output
is committed there and its per-row error decides which rows are recomputed in full.

An adapter (:class:`~.hooks.ForecastHooks` on a diffusers transformer, ``ComfyForecast`` on a ComfyUI
model) finds the step and the branch, plans the call (:meth:`ForecastEngine._plan`), calls
:meth:`ForecastEngine.run_block` from each block's wrapper with a :class:`StreamIO` for the block's
calling convention, recomputes the rows the verifier sends back and closes the call
(:meth:`ForecastEngine._finish`). All per-call state is in one :class:`ForecastCall`.

Example:
    >>> from diffspec.config import ForecastConfig
    >>> from diffspec.stats import SpecStats
    >>> engine = ForecastEngine(ForecastConfig(warmup=1), SpecStats(), [2])
    >>> call = engine._plan(engine._new_branch(rows=2), step=0, num_steps=10, t=999.0, schedule=engine.schedule)
    >>> call.mode, call.full_rows
    ('full', [True, True])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from ..config import ForecastConfig, SpecaConfig
from ..stats import SpecStats
from .gate import Schedule, anchor_pairs, decide_rows, verify_error
from .rows import merge_rows
from .taylor import TaylorForecaster

Streams = dict[str, Any]
"""A block's streams by name (diffusers: ``"hidden"``, ``"encoder"``; ComfyUI: ``"img"``, ``"txt"``...), batch-first."""


class StreamIO(Protocol):
    """How the engine reads and writes one block's streams, whatever its calling convention: ``run(*args, **kwargs)``
    is the real block."""

    whole_batch: bool  # the verifier runs the block on every row (the checked rows are kept)

    def inputs(self, args: tuple, kwargs: dict) -> Streams: ...  # stream inputs as anchors keep them
    def earlier_inputs(self, args: tuple, kwargs: dict) -> Streams: ...  # inputs carrying earlier blocks' outputs
    def streams(self, args: tuple, kwargs: dict) -> Streams: ...  # stream inputs of a draft
    def outputs(self, out: Any) -> Streams: ...  # streams of a real output (learns the output's form)
    def observe(self, out: Any) -> None: ...  # learn the output's form from a real output
    def pack(self, streams: Streams) -> Any: ...  # an output in the block's form (side outputs zero)

    def run_rows(self, run: Callable[..., Any], args: tuple, kwargs: dict, replace: Streams | None,
                 rows: torch.Tensor, batch: int) -> Streams: ...  # the real block's output streams of ``rows``


@dataclass(frozen=True)
class BlockPosition:
    """Where a block sits: its list, its index there, and what that makes it do."""

    list_index: int
    block_index: int
    first: bool
    last: bool
    split: bool  # in the verified list: its last block is forecast (and verified) on its own
    side_only: bool = False  # a list whose stream nothing reads after it, only its side outputs


@dataclass
class ListState:
    """One block list's anchors and what a call in progress keeps of it."""

    forecasters: dict[str, TaylorForecaster] = field(default_factory=dict)  # "list:hidden", "tail:encoder"...
    inputs: Streams = field(default_factory=dict)  # the first block's stream inputs (a full call)
    tail_inputs: Streams = field(default_factory=dict)  # the verified last block's stream inputs
    earlier: Streams = field(default_factory=dict)  # its inputs carrying earlier blocks' outputs (long skips)
    none_streams: frozenset[str] = frozenset()  # streams the last block returns as None (SD3's last block)
    drafts: dict[str, torch.Tensor] | None = None  # forecasts made before the call (fp32), taken once; None: on demand
    pending: tuple | None = None  # (last block's outputs, split, single list), recorded after the call
    drafted: Streams | None = None  # a draft's streams as its first block returned them (copies)


@dataclass
class Branch:
    """One CFG branch's anchors and per-row run lengths."""

    lists: list[ListState]
    since_full: list[int | None]  # per row: drafts since the last full step (None: never full)
    force_full: list[bool]  # per row: the lazy policy rejected the previous draft
    key: Any = None  # what must not change for its anchors to stay valid (input shapes)


@dataclass
class ForecastCall:
    """The plan and the state of one model call (one CFG branch at one step)."""

    branch: Branch
    x: float  # forecast abscissa
    step: float  # position in the generation
    progress: float  # fraction of the generation done (the verifier threshold's argument)
    full_rows: list[bool]
    check_rows: list[bool]
    mode: str  # "full" or "draft"; "full" again while rows are recomputed
    run_verifier: bool = False
    record_rows: list[int] | None = None  # rows whose anchors a full pass records (None: all)
    errors: torch.Tensor | None = None  # the verifier's per-row errors
    verified_rows: int = 0  # rows the verifier ran
    residuals_between: bool = False  # the model adds residuals between blocks (ControlNet)
    between_blocks: bool = False  # the last block run was not its list's last (interleaved modules)
    modules_real: bool = False  # the verifier runs forecast submodules for real, without recording
    lists_as_passed: tuple[dict, dict] = field(default_factory=lambda: ({}, {}))  # a draft's list arguments, as passed
    per_row_lists: bool = False  # the latents come as a list of per-row tensors (Z-Image)

    @property
    def is_draft(self) -> bool:
        """Whether the call was planned as a draft (some row drafts)."""
        return not all(self.full_rows)


class ForecastEngine:
    """Anchors, call plans, block steps and statistics of block forecasting (see the module docstring).

    Args:
        config: a :class:`ForecastConfig` (``taylor``) or :class:`SpecaConfig` (``speca``).
        stats: counters to update (``full_steps``, ``forecast_steps``, ``target_calls``...).
        list_sizes: the number of blocks of each forecast list, in execution order.
    """

    defer_records: ClassVar[bool] = True
    """Anchors are recorded when the call ends, outside the blocks (False: at the list's last block)."""

    def __init__(self, config: ForecastConfig | SpecaConfig, stats: SpecStats, list_sizes: Sequence[int]) -> None:
        self.config = config
        self.stats = stats
        self.schedule = Schedule.of(config)
        self.verify = self.schedule.verify
        self.num_lists = len(list_sizes)
        self.num_blocks = sum(list_sizes)
        self.granularity = "block"  # the diffusers hooks may pick "module"
        self.order = config.order  # lowered by a cache budget
        self.branches: dict[Any, Branch] = {}
        self.call: ForecastCall | None = None
        self._peak_bytes = 0

    # ----------------------------------------------------------------- calls
    def _new_branch(self, rows: int, key: Any = None) -> Branch:
        return Branch([ListState() for _ in range(self.num_lists)], [None] * rows, [False] * rows, key)

    def _plan(self, branch: Branch, step: float, num_steps: int | None, t: float, schedule: Schedule,
              first_step: int = 0) -> ForecastCall:
        """Plan a call of ``branch`` at ``step`` (timestep ``t``) and make it the current one."""
        full_rows = [schedule.forced_full(step, num_steps, s, first_step) or f  # type: ignore[arg-type]
                     for s, f in zip(branch.since_full, branch.force_full)]
        check_rows = [not f and schedule.checked(s) for f, s in zip(full_rows, branch.since_full)]
        mode = "full" if all(full_rows) else "draft"
        self.call = ForecastCall(branch, float(step) if self.config.abscissa == "index" else t, step,
                                 step / max(num_steps - 1, 1) if num_steps else 0.0, full_rows, check_rows, mode,
                                 run_verifier=mode == "draft" and any(check_rows))
        for state in branch.lists:
            state.pending = state.drafted = None
        return self.call

    def _decide(self, recompute: list[bool], label: float) -> None:
        """Turn the verifier's per-row errors into recompute / lazy decisions (one host read); ``label``: the step
        as the statistics log it."""
        call = self.call
        if not self.verify or call is None or call.errors is None:
            return
        tau = self.config.tau(call.progress)  # type: ignore[union-attr]
        extra = self.stats.extra
        decide_rows(call.errors, call.check_rows, recompute, call.branch.force_full, tau,
                    self.config.policy == "strict", extra, label)  # type: ignore[union-attr]
        if call.run_verifier:
            extra["verifier_blocks"] = extra.get("verifier_blocks", 0) + 1
            extra["verifier_evals"] = extra.get("verifier_evals", 0.0) + call.verified_rows / len(recompute) / self.num_blocks

    def _finish(self, recompute: list[bool], evals: float) -> None:
        """Close the current call: record the full pass's anchors, move the run lengths, count (``evals``: rows
        computed in full, as a fraction of the batch)."""
        call = self.call
        assert call is not None
        for state in call.branch.lists:
            if state.pending is not None:
                outs, split, single = state.pending
                state.pending = None
                self._record(state, outs, split, single)
        branch = call.branch
        for r, full in enumerate(recompute):
            since = branch.since_full[r]
            branch.since_full[r] = 0 if full else since + 1  # type: ignore[operator]
            if full:
                branch.force_full[r] = False
        self._count(recompute, evals)

    def _count(self, recompute: list[bool], evals: float) -> None:
        stats, call = self.stats, self.call
        assert call is not None
        committed_drafts = recompute.count(False)
        stats.count_rows(recompute.count(True), len(recompute))
        if any(recompute):
            stats.target_calls += 1
            stats.target_evals += evals
            held = sum(f.nbytes for b in self.branches.values() for ls in b.lists for f in ls.forecasters.values())
            self._peak_bytes = max(self._peak_bytes, held)
            stats.extra_mem_gb = self._peak_bytes / 1e9
        if call.is_draft:
            stats.draft_calls += 1
            stats.proposed += call.full_rows.count(False)
            stats.accepted += committed_drafts

    # ----------------------------------------------------------------- blocks
    def run_block(self, at: BlockPosition, io: StreamIO, run: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """One block call under the current plan: run it (and keep what anchors need), or draft it."""
        call = self.call
        assert call is not None
        state = call.branch.lists[at.list_index]
        if call.mode == "full":
            return self._full_block(state, at, io, run, args, kwargs)
        streams = io.streams(args, kwargs)
        if at.side_only:
            return io.pack(streams)
        streams = self._draft_streams(state, at, streams)
        if not at.last:
            return io.pack(streams)
        if not at.split:
            return io.pack({k: None if k in state.none_streams else v for k, v in streams.items()})
        return self._verified_tail(state, io, run, args, kwargs, streams)

    def _full_block(self, state: ListState, at: BlockPosition, io: StreamIO, run: Callable[..., Any], args: tuple,
                    kwargs: dict) -> Any:
        if at.first:
            state.inputs = io.inputs(args, kwargs)
        if at.last and at.split:
            state.tail_inputs, state.earlier = io.inputs(args, kwargs), io.earlier_inputs(args, kwargs)
        out = run(*args, **kwargs)
        if not (at.last and not at.side_only and self.granularity != "module"):
            io.observe(out)
        elif self.defer_records:
            outs = io.outputs(out)
            if self.call.residuals_between:  # type: ignore[union-attr]  # the model may add to them in place
                outs = {k: v.clone() if v is not None else None for k, v in outs.items()}
            state.pending = (outs, at.split, at.first)
        else:
            self._record(state, io.outputs(out), at.split, at.first)
        return out

    def _draft_streams(self, state: ListState, at: BlockPosition, streams: Streams) -> Streams:
        """A draft's streams at a block: forecast at a list's first block; at its last, those the first block drafted
        where the model adds residuals between blocks (a stream whose shape changed since is kept)."""
        if at.first:
            head = "body" if at.split else "list"
            streams = {k: self._apply(state, f"{head}:{k}", v) for k, v in streams.items()}
            if self.call.residuals_between and not at.last:  # type: ignore[union-attr]  # copies: added to in place
                state.drafted = {k: v.clone() for k, v in streams.items() if isinstance(v, torch.Tensor)}
        elif at.last and state.drafted is not None:
            drafted, state.drafted = state.drafted, None
            streams = {k: drafted[k].to(v.dtype) if _same_shape(drafted.get(k), v) else v for k, v in streams.items()}
        return streams

    def _verified_tail(self, state: ListState, io: StreamIO, run: Callable[..., Any], args: tuple, kwargs: dict,
                       streams: Streams) -> Any:
        """The last block on a draft: draft it, run it for real on the drafted input where a row is checked."""
        hats = {k: None if k in state.none_streams else self._apply(state, f"tail:{k}", v) for k, v in streams.items()}
        replace = None
        if self.call.run_verifier:  # type: ignore[union-attr]
            earlier = io.earlier_inputs(args, kwargs)
            replace = {**streams, **{n: self._apply_raw(state, f"tail:{n}", v) for n, v in earlier.items()}}
        return self.verify_block(io, run, args, kwargs, hats, streams, replace)

    def verify_block(self, io: StreamIO, run: Callable[..., Any], args: tuple, kwargs: dict, hats: Streams,
                     streams: Streams, replace: Streams | None) -> Any:
        """Run the last block for real (on ``replace``'d inputs) for the checked rows, measure the draft ``hats``'
        error per row and commit the true output there; without a check, only test finiteness. ``streams``: the
        block's inputs (``rel_res``'s reference)."""
        call = self.call
        assert call is not None
        primary = _primary(hats)
        h_hat = hats[primary]
        if not call.run_verifier:
            call.errors = verify_error(h_hat, h_hat)  # 0, or inf for a row that is not finite
            return io.pack(hats)
        batch, rows = len(call.check_rows), [r for r, c in enumerate(call.check_rows) if c]
        checked = torch.tensor(rows)
        call.modules_real = True
        try:
            true = io.run_rows(run, args, kwargs, replace, checked, batch)
        finally:
            call.modules_real = False
        call.verified_rows = batch if io.whole_batch else len(rows)
        index = checked.to(h_hat.device, non_blocking=True)
        errors = verify_error(h_hat.index_select(0, index), true[primary], self.config.metric,  # type: ignore[union-attr]
                              streams[primary].index_select(0, index))
        call.errors = verify_error(h_hat, h_hat).index_copy(0, index, errors)
        return io.pack({k: merge_rows(checked, true[k], v) if isinstance(v, torch.Tensor)
                        and isinstance(true.get(k), torch.Tensor) else v for k, v in hats.items()})

    # ----------------------------------------------------------------- anchors
    def _record(self, state: ListState, outs: Streams, split: bool, single: bool) -> None:
        call = self.call
        assert call is not None
        for head, ins, outs_ in anchor_pairs(split, single, state.inputs, state.tail_inputs, outs):
            for stream in outs:
                x_in, out = ins.get(stream), outs_.get(stream)
                if not isinstance(x_in, torch.Tensor) or not isinstance(out, torch.Tensor) or out.shape != x_in.shape:
                    continue
                self._forecaster(state, f"{head}:{stream}").update(call.x, out - x_in, call.record_rows)
        for name, value in state.earlier.items():
            if isinstance(value, torch.Tensor):
                self._forecaster(state, f"tail:{name}").update(call.x, value, call.record_rows)
        state.inputs, state.tail_inputs, state.earlier = {}, {}, {}
        state.none_streams = frozenset(k for k, v in outs.items() if v is None)

    def _forecaster(self, state: ListState, key: str) -> TaylorForecaster:
        f = state.forecasters.get(key)
        if f is None:
            f = state.forecasters[key] = TaylorForecaster(self.order, self.config.form)
        return f

    def _draft(self, state: ListState, key: str) -> torch.Tensor | None:
        """This call's forecast of ``key`` (fp32): the one made before the call (taken once), else made now."""
        if state.drafts is not None:
            return state.drafts.pop(key, None)
        f = state.forecasters.get(key)
        return None if f is None else f.forecast(self.call.x)  # type: ignore[union-attr]

    def _apply(self, state: ListState, key: str, x: Any) -> Any:
        """``x`` plus the forecast residual ``key`` (``x`` where none is recorded)."""
        draft = self._draft(state, key) if isinstance(x, torch.Tensor) else None
        return x if draft is None else (x.float() + draft).to(x.dtype)

    def _apply_raw(self, state: ListState, key: str, x: Any) -> Any:
        """The forecast of a recorded block input itself (not a residual); ``x`` when none is recorded."""
        draft = self._draft(state, key) if isinstance(x, torch.Tensor) else None
        return x if draft is None else draft.to(x.dtype)


def _same_shape(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape


def _primary(streams: Streams) -> str:
    """The stream the verifier measures: the first that is a tensor (the image stream)."""
    for name, value in streams.items():
        if isinstance(value, torch.Tensor):
            return name
    raise ValueError("the verified block returned no tensor stream")
