"""Attaching block forecasting to a diffusers transformer.

Each block's ``forward`` is replaced on the instance (removed again by :meth:`detach`, which
restores the original behaviour bit for bit). On a full step every block runs and the residual
``out - in`` of each block list (per stream: image tokens, and text tokens where a list outputs
them) is stored as an anchor. On a forecast step no block runs: the first block of each list
returns ``in + forecast(residual)`` and the other blocks pass their inputs through (where the model adds
ControlNet residuals between the blocks, the last block takes the first one's output back:
 the profile's ``between_block_args``).

Steps and CFG branches are detected from the ``timestep`` argument of the transformer, so no
``cache_context`` is needed: a new value is a new step, a repeated value within a step is the
next CFG branch (pipelines that call the transformer once per branch), an increase starts a new
generation (a decrease, for the transformers fed ``1 - sigma``: the profile's ``increasing_timesteps``). A
change of the token count (latent or text) resets that branch instead of failing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import ForecastConfig, SpecaConfig
from ..stats import SpecStats
from .blocks import HIDDEN_ARGS, BlockIO, find_block_lists
from .budget import settle_cache
from .claims import claim, release
from .compile import CompiledCalls
from .gate import Schedule, anchor_pairs, decide_rows, verify_error
from .modules import ModuleForecasts, check_module_support, supports_modules, wrap_submodules
from .profiles import block_profile, profile_of
from .rows import merge_rows, take_call_rows
from .steps import TIMESTEP_ARGS, StepTracker
from .taylor import TaylorForecaster


@dataclass
class _ListState:
    forecasters: dict[str, TaylorForecaster] = field(default_factory=dict)  # "list:hidden", "tail:encoder"...
    inputs: dict[str, torch.Tensor | None] = field(default_factory=dict)
    tail_inputs: dict[str, torch.Tensor | None] = field(default_factory=dict)
    encoder_out_none: bool = False  # the list's last block returns no text stream (SD3's last block)
    drafts: dict[str, torch.Tensor] = field(default_factory=dict)  # this draft call's forecasts (fp32), by key
    pending: tuple | None = None  # the last block's (hidden, encoder, split, single), recorded after the call
    drafted: tuple | None = None  # the first block's drafted (hidden, encoder), while between-block args are passed


@dataclass
class _BranchState:
    lists: list[_ListState]
    input_shape: tuple  # (latent input's shape, encoder_hidden_states' shape), None where not a tensor
    since_full: list[int | None]  # per row: drafts since the last full step (None: never full)
    force_full: list[bool]  # per row: the lazy policy rejected the previous draft


class ForecastHooks(ModuleForecasts):
    """Block-level forecasting (``taylor``) and verified forecasting (``speca``) on one transformer.

    Each call is planned per batch row (:class:`Schedule`). If every row is full, the call runs
    in full and records anchors. Otherwise a draft pass runs: no block runs except, for
    ``speca``, the last block on the drafted input (the verifier). Rows that must be full (or,
    with ``policy="strict"``, whose draft was rejected or not finite) are then recomputed in one
    full pass and merged per row, so a row's output never depends on its batch neighbours.
    A draft step costs one host read (the verifier's per-row errors); ``taylor`` has none.
    Forecasts are made by the pre-hook and anchors recorded by the post-hook, so the block wrappers
    can be traced by ``torch.compile`` (see :mod:`diffspec.forecast.compile`).

    Args:
        transformer: a diffusers transformer (``DiTTransformer2DModel``, ``FluxTransformer2DModel``...).
        config: a :class:`ForecastConfig` or :class:`SpecaConfig`.
        stats: counters to update (``full_steps``, ``forecast_steps``, ``target_calls``...).
        num_steps_fn: returns the number of transformer steps of the current generation
            (e.g. ``len(pipe.scheduler.timesteps)``), or None if unknown.
        tracker: a :class:`~.steps.StepTracker` shared with the pipeline's other denoisers (Wan 2.2's
            ``transformer_2``, Ideogram 4's ``unconditional_transformer``), so that steps count the pipeline's
            steps; by default the hooks track their transformer's calls alone.

    Example:
        >>> hooks = ForecastHooks(pipe.transformer, ForecastConfig(), SpecStats())  # doctest: +SKIP
        >>> hooks.attach(); ...; hooks.detach()  # doctest: +SKIP
    """

    def __init__(
        self,
        transformer: nn.Module,
        config: ForecastConfig | SpecaConfig,
        stats: SpecStats,
        num_steps_fn: Callable[[], int | None] | None = None,
        tracker: StepTracker | None = None,
    ) -> None:
        self.transformer = transformer
        self.config = config
        self.stats = stats
        self.num_steps_fn = num_steps_fn or (lambda: None)
        self._schedule = Schedule.of(config)  # placed per generation (for_steps), once its step count is known
        self.schedule = self._schedule
        self.verify = self.schedule.verify
        self.calls = CompiledCalls(transformer)
        self.profile = profile_of(self.calls.model)
        self.block_lists = find_block_lists(self.calls.model, config.blocks)
        self._num_blocks = sum(len(blocks) for _, blocks in self.block_lists)
        blocks = [b for _, bl in self.block_lists for b in bl]
        if config.granularity == "module":
            check_module_support(blocks)
        self.module_ok = all(supports_modules(b) for b in blocks)
        self._decide_cache = config.granularity == "auto" or config.max_cache_gb is not None
        self.granularity = "block"  # effective: "block", "module", or "pending" (measured at step 0, chosen at step 1)
        self._order = config.order
        self.modules_real = False  # the verifier runs the submodules for real, without recording
        increasing = self.profile.increasing_timesteps
        if tracker is not None and tracker.increasing != increasing:
            raise ValueError(f"{type(self.calls.model).__name__}: a shared step tracker must read timesteps the same "
                             f"way (increasing={tracker.increasing}, this transformer: {increasing})")
        self.tracker = tracker or StepTracker(increasing=increasing)
        self._generation = self.tracker.generation  # the last generation these hooks were called in
        self._first_step = 0  # the step of this generation at which this transformer was first called
        self._params = list(inspect.signature(self.calls.model.forward).parameters)
        self._timestep_name = next((n for n in TIMESTEP_ARGS if n in self._params), "timestep")
        self._hidden_name = next((n for n in HIDDEN_ARGS if n in self._params), "hidden_states")
        self._per_row_lists = False  # latents passed as a list of per-row tensors (Z-Image)
        self._handles: list[Any] = []
        self._patched: list[tuple[nn.Module, Any]] = []  # (module, the instance forward it had before, or None)
        self._branches: dict[int, _BranchState] = {}
        self._num_steps: int | None = None
        self._branch: _BranchState | None = None
        self._peak_bytes = 0
        # the current call
        self.mode = "full"  # "full" or "draft"
        self._x = 0.0
        self._progress = 0.0
        self._full_rows: list[bool] = []
        self._check_rows: list[bool] = []
        self._run_verifier = False
        self._record_rows: list[int] | None = None
        self._errors: torch.Tensor | None = None
        self._call_lists: tuple[dict[int, list], dict[str, list]] = ({}, {})  # a draft call's list arguments, as passed
        self._between_blocks = False  # the last block run was not its list's last (interleaved modules)
        self._between_residuals = False  # the call passes residuals added between blocks

    @property
    def full(self) -> bool:
        """Whether the current call runs in full."""
        return self.mode == "full"

    @property
    def module_recording(self) -> bool:
        """Whether submodule anchors are recorded (module granularity, or not decided yet)."""
        return self.module_ok and self.granularity in ("module", "pending")

    # ----------------------------------------------------------------- lifecycle
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self) -> None:
        """Install the hooks (idempotent).

        Raises:
            ValueError: other diffspec hooks hold the transformer (:mod:`~.claims`); nothing is installed.
        """
        if self.attached:
            return
        claim(self.calls.model, self, self.config.method, type(self.calls.model).__name__)
        pre, post = torch.compiler.disable(self._pre_forward), torch.compiler.disable(self._post_forward)
        self._handles.append(self.transformer.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(self.transformer.register_forward_hook(post, with_kwargs=True))
        for li, (name, blocks) in enumerate(self.block_lists):
            last = len(blocks) - 1
            split = self.verify and li == len(self.block_lists) - 1
            for bi, block in enumerate(blocks):
                previous = block.__dict__.get("forward")  # e.g. accelerate's offload hook: kept inside, restored
                block.forward = self._wrap(block, li, bi, first=bi == 0, last=bi == last, split=split,
                                           side_only=name in self.profile.side_output_lists)
                self._patched.append((block, previous))
                if self.module_ok and self.config.granularity != "block":
                    self._patched.extend(wrap_submodules(self, block, li, bi, self.calls.submodule_forward))
        for name in self.profile.interleaved_modules:
            for module in getattr(self.calls.model, name):
                previous = module.__dict__.get("forward")
                module.forward = self._wrap_interleaved(module)
                self._patched.append((module, previous))

    def detach(self) -> None:
        """Remove every hook and wrapper; the transformer behaves as if never wrapped."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for module, previous in reversed(self._patched):
            if previous is not None:
                module.forward = previous
            elif "forward" in module.__dict__:
                del module.forward
        self._patched.clear()
        self.calls.restore()
        release(self.calls.model, self)
        self.reset()

    def reset(self) -> None:
        """Forget all anchors and the step position (a new generation follows)."""
        self.tracker.reset()
        self._branches.clear()
        self._num_steps = None

    def certain_draft(self, step: int) -> bool:
        """Whether this transformer's call at ``step`` (the next one) drafts every row of every CFG branch without a
        check: what a ControlNet called before it may rely on (:mod:`~.controlnet`). False before its first call of
        a generation."""
        if not self._branches or self.tracker.step != step - 1:
            return False
        sched, n = self.schedule, self._num_steps
        return all(not forced and since is not None and not sched.forced_full(step, n, since, self._first_step)
                   and not sched.checked(since)
                   for branch in self._branches.values() for since, forced in zip(branch.since_full, branch.force_full))

    # ----------------------------------------------------------------- transformer hooks
    def _arg(self, name: str, args: tuple, kwargs: dict) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = self._params.index(name) if name in self._params else None
        return args[i] if i is not None and i < len(args) else None

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        for name, why in self.profile.refused_args.items():
            if self._arg(name, args, kwargs) is not None:
                raise ValueError(f"{type(self.calls.model).__name__}: {name} is not supported with block "
                                 f"forecasting: {why}")
        self.calls.borrow()
        t = self.tracker.read(self._arg(self._timestep_name, args, kwargs))
        self.tracker.observe(t)
        if self.tracker.generation != self._generation:  # a new generation (seen here or by a shared tracker)
            self._generation, self._first_step = self.tracker.generation, self.tracker.step
            self._branches.clear()
            self._num_steps = self.num_steps_fn()
            self.schedule = self._schedule.for_steps(self._num_steps)
            self.schedule.check_steps(self._num_steps)
            self._order = self.config.order
            self.granularity = "pending" if self._decide_cache else self.config.granularity
        step, num_steps = self.tracker.step, self._num_steps
        if self.granularity == "pending" and step > self._first_step:
            self._choose_cache()
        hidden = self._arg(self._hidden_name, args, kwargs)
        self._per_row_lists = isinstance(hidden, list) and all(isinstance(h, torch.Tensor) for h in hidden)
        if self._per_row_lists:  # (rows, each row's shape...)
            shape = (len(hidden), *(tuple(h.shape) for h in hidden))
        else:
            shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else None
        rows = shape[0] if shape else 1
        # the text's shape too: Bria FIBO 2.0 derives its gist-token count from the prompt's length
        text = self._arg("encoder_hidden_states", args, kwargs)
        key = (shape, tuple(text.shape) if isinstance(text, torch.Tensor) else None)
        branch = self._branches.get(self.tracker.branch)
        if branch is None or branch.input_shape != key:  # new branch, or token count / batch changed
            branch = _BranchState([_ListState() for _ in self.block_lists], key, [None] * rows, [False] * rows)
            self._branches[self.tracker.branch] = branch
        self._branch = branch
        self._x = float(step) if self.config.abscissa == "index" else t
        self._progress = step / max(num_steps - 1, 1) if num_steps else 0.0
        sched = self.schedule
        self._full_rows = [sched.forced_full(step, num_steps, s, self._first_step) or f
                           for s, f in zip(branch.since_full, branch.force_full)]
        self._check_rows = [not f and sched.checked(s) for f, s in zip(self._full_rows, branch.since_full)]
        self._errors = None
        self._between_blocks = False
        self._between_residuals = any(self._arg(n, args, kwargs) is not None for n in self.profile.between_block_args)
        if all(self._full_rows):
            self.mode, self._record_rows = "full", None
        else:
            self.mode, self._run_verifier = "draft", any(self._check_rows)
            # lists as passed: a model may consume one (HunyuanDiT pops its ControlNet samples); a recompute gets them whole
            self._call_lists = ({i: list(a) for i, a in enumerate(args) if isinstance(a, list)},
                                {k: list(v) for k, v in kwargs.items() if isinstance(v, list)})
        for state in branch.lists:  # forecasts made here, outside any compiled region
            state.drafts = {k: f.forecast(self._x) for k, f in state.forecasters.items()} if self.mode == "draft" else {}
            state.pending = state.drafted = None

    def _post_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        branch = self._branch
        assert branch is not None
        recompute = [True] * len(self._full_rows) if self.mode == "full" else list(self._full_rows)
        drafted = self.mode == "draft"
        if drafted:
            self._decide(branch, recompute)
            if any(recompute):  # planned-full rows and strict rejections: one full pass over just those rows
                output = self._recompute(module, args, kwargs, recompute, output)
        for state in branch.lists:  # anchors of the full pass
            if state.pending is not None:
                *outs, split, single = state.pending
                state.pending = None
                self._record(state, *outs, split=split, single=single)
        for r, full in enumerate(recompute):
            since = branch.since_full[r]
            branch.since_full[r] = 0 if full else since + 1  # type: ignore[operator]
            if full:
                branch.force_full[r] = False
        self._count(recompute, drafted)
        return output

    def _recompute(self, module: nn.Module, args: tuple, kwargs: dict, recompute: list[bool], drafted: Any) -> Any:
        """Run the transformer in full on the rows to recompute and merge them into the drafted output."""
        self.mode = "full"
        listed, listed_kw = self._call_lists
        args = tuple(list(listed[i]) if i in listed else a for i, a in enumerate(args))
        kwargs = {k: list(listed_kw[k]) if k in listed_kw else v for k, v in kwargs.items()}
        if all(recompute):
            self._record_rows = None
            return self.calls.forward(module)(*args, **kwargs)
        rows = [r for r, full in enumerate(recompute) if full]
        batch = len(recompute)
        index = torch.tensor(rows)
        self._record_rows = rows
        if self.profile.batch_coupled:  # the whole batch, only ``rows`` kept
            return merge_rows(index, self.calls.forward(module)(*args, **kwargs), drafted, self._per_row_lists)
        sub_args, sub_kwargs = take_call_rows(args, kwargs, self._params, index, batch, self._per_row_lists,
                                              unbatched=self.profile.unbatched_args)
        return merge_rows(index, self.calls.forward(module)(*sub_args, **sub_kwargs), drafted, self._per_row_lists)

    def _decide(self, branch: _BranchState, recompute: list[bool]) -> None:
        """Turn the verifier's per-row errors into recompute / lazy decisions (one host read)."""
        if not self.verify or self._errors is None:
            return
        tau = self.config.tau(self._progress)  # type: ignore[union-attr]
        extra = self.stats.extra
        checked = decide_rows(self._errors, self._check_rows, recompute, branch.force_full, tau,
                              self.config.policy == "strict", extra, self.tracker.step)  # type: ignore[union-attr]
        if self._run_verifier:
            extra["verifier_blocks"] = extra.get("verifier_blocks", 0) + 1
            extra["verifier_evals"] = extra.get("verifier_evals", 0.0) + len(checked) / len(recompute) / self._num_blocks

    def _count(self, recompute: list[bool], drafted: bool) -> None:
        stats = self.stats
        committed_drafts = recompute.count(False)
        if self.tracker.branch == 0:  # SpecStats: steps, branches, and full/forecast steps as shares of rows
            stats.steps += 1
        stats.branches = max(stats.branches, self.tracker.branch + 1)
        stats.count_rows(recompute.count(True), len(recompute))
        if any(recompute):
            stats.target_calls += 1
            stats.target_evals += recompute.count(True) / len(recompute)  # rows computed in full, per row
            held = sum(f.nbytes for b in self._branches.values() for ls in b.lists for f in ls.forecasters.values())
            self._peak_bytes = max(self._peak_bytes, held)
            stats.extra_mem_gb = self._peak_bytes / 1e9
        if self.verify:  # where the gate put its full steps: rows computed in full, per step (summed over calls)
            by_step = stats.extra.setdefault("full_by_step", [])
            calls = stats.extra.setdefault("calls_by_step", [])
            step = self.tracker.step
            by_step.extend([0.0] * (step + 1 - len(by_step)))
            calls.extend([0] * (step + 1 - len(calls)))
            by_step[step] += recompute.count(True) / len(recompute)
            calls[step] += 1
        if drafted:
            stats.draft_calls += 1
            stats.proposed += self._full_rows.count(False)
            stats.accepted += committed_drafts

    # ----------------------------------------------------------------- block wrapper
    def _wrap(self, block: nn.Module, list_index: int, block_index: int, first: bool, last: bool,
              split: bool, side_only: bool = False) -> Callable[..., Any]:
        """``split``: the verified list, whose last block is forecast (and verified) on its own. ``side_only``: a
        list of the profile's ``side_output_lists``, passed through with zero side outputs on a draft, never cached."""
        original = self.calls.block_forward(block)
        io = BlockIO.for_block(block, original)
        hooks = self
        head = "body" if split else "list"
        draft_forward = block_profile(block).draft_forward

        def module_draft(*args: Any, **kwargs: Any) -> Any:
            """The block on a draft step at module granularity (its submodules return forecasts)."""
            if draft_forward is None:
                return original(*args, **kwargs)
            return draft_forward(hooks, block, list_index, block_index, **io.as_kwargs(args, kwargs))

        def forward(*args: Any, **kwargs: Any) -> Any:
            hooks._between_blocks = not last
            state = hooks._branch.lists[list_index] if hooks._branch is not None else None
            if state is None:
                return original(*args, **kwargs)
            hidden = io.arg("hidden_states", args, kwargs)
            encoder = io.arg("encoder_hidden_states", args, kwargs)
            if hooks.mode == "full":
                if first:
                    state.inputs = {"hidden": hidden, "encoder": encoder}
                if last and split:  # plus inputs taken from earlier blocks (HunyuanDiT's long ``skip``)
                    state.tail_inputs = {"hidden": hidden, "encoder": encoder,
                                         **{n: io.arg(n, args, kwargs) for n in io.earlier}}
                out = original(*args, **kwargs)
                if last and hooks.granularity != "module" and not side_only:
                    outs = io.split_output(out)
                    if hooks._between_residuals:  # Chroma and Bria add the residual after it in place
                        outs = tuple(o.clone() if o is not None else None for o in outs)
                    state.pending = (*outs, split, first)
                elif io.returns_tensor is None:
                    io.split_output(out)  # learn the layout for draft steps
                return out
            if side_only:
                return io.pack(hidden, encoder)
            if hooks.granularity == "module":
                if not (last and split):
                    return module_draft(*args, **kwargs)
                return hooks._verify(io, original, args, kwargs, *io.split_output(module_draft(*args, **kwargs)),
                                     hidden)
            if first:
                hidden = hooks._apply(state, f"{head}:hidden", hidden)
                encoder = hooks._apply(state, f"{head}:encoder", encoder)
                if hooks._between_residuals and not last:  # a copy: the model may add to the stream in place
                    state.drafted = tuple(x.clone() if isinstance(x, torch.Tensor) else None for x in (hidden, encoder))
            elif last and state.drafted is not None:
                hidden, encoder = hooks._drafted_stream(state, hidden, encoder)
            if not last:
                return io.pack(hidden, encoder)
            if not split:
                return io.pack(hidden, None if state.encoder_out_none else encoder)
            return hooks._verified_tail(state, io, original, args, kwargs, hidden, encoder)

        return forward

    def _wrap_interleaved(self, module: nn.Module) -> Callable[..., Any]:
        """A module run between two blocks of a list, its output added to the stream (the profile's ``interleaved_modules``):
        on a block-granularity draft it returns zeros shaped like its ``hidden_states`` there, its part being in the
        list's forecast residual; one after a list's last block runs as usual."""
        original = module.forward
        signature = inspect.signature(original)
        hooks = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            if hooks.mode == "draft" and hooks.granularity != "module" and hooks._between_blocks:
                return torch.zeros_like(signature.bind(*args, **kwargs).arguments["hidden_states"])
            return original(*args, **kwargs)

        return forward

    @staticmethod
    def _drafted_stream(state: _ListState, hidden: torch.Tensor, encoder: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The streams for a list's last block on a draft where the model adds residuals between blocks
        (the profile's ``between_block_args``): those its first block drafted, since the list's forecast residual
        already holds what was added after its other blocks. A stream whose shape changed since is kept."""
        drafted, state.drafted = state.drafted, None

        def pick(x0: torch.Tensor | None, x: torch.Tensor | None) -> torch.Tensor | None:
            if isinstance(x0, torch.Tensor) and isinstance(x, torch.Tensor) and x0.shape == x.shape:
                return x0.to(x.dtype)
            return x

        return pick(drafted[0], hidden), pick(drafted[1], encoder)  # type: ignore[index]

    def _verified_tail(self, state: _ListState, io: BlockIO, original: Callable[..., Any], args: tuple, kwargs: dict,
                       hidden: torch.Tensor, encoder: torch.Tensor | None) -> Any:
        """The last block on a draft step: draft it, run it for real on the drafted input if a row is
        checked, and commit the true output for checked rows."""
        h_hat = self._apply(state, "tail:hidden", hidden)
        e_hat = None if state.encoder_out_none else self._apply(state, "tail:encoder", encoder)
        if self._run_verifier:
            earlier = {n: self._apply_raw(state, f"tail:{n}", io.arg(n, args, kwargs)) for n in io.earlier}
            args, kwargs = io.with_inputs(args, kwargs, hidden_states=hidden, encoder_hidden_states=encoder, **earlier)
        return self._verify(io, original, args, kwargs, h_hat, e_hat, hidden)

    def _verify(self, io: BlockIO, original: Callable[..., Any], args: tuple, kwargs: dict, h_hat: torch.Tensor,
                e_hat: torch.Tensor | None, hidden: torch.Tensor) -> Any:
        """Run the last block for real on the drafted input (``args``) for the checked rows, measure the
        draft's error per row and commit the true output there; without a check, only test finiteness."""
        if not self._run_verifier:
            self._errors = verify_error(h_hat, h_hat)  # 0, or inf for a row that is not finite
            return io.pack(h_hat, e_hat)
        batch, rows = len(self._check_rows), [r for r, c in enumerate(self._check_rows) if c]
        checked = torch.tensor(rows)
        subset = len(rows) < batch
        if subset and not io.seq_first:  # run the verifier on the checked rows only
            names = sorted(io.param_index, key=io.param_index.__getitem__)
            args, kwargs = take_call_rows(args, kwargs, names, checked, batch, unbatched=self.profile.unbatched_args)
        self.modules_real = True
        try:
            y_h, y_e = io.split_output(original(*args, **kwargs))
        finally:
            self.modules_real = False
        index = checked.to(h_hat.device, non_blocking=True)
        if subset and io.seq_first:  # run on every row: keep the checked ones
            y_h = y_h.index_select(0, index)
            y_e = y_e.index_select(0, index) if y_e is not None else None
        errors = verify_error(h_hat.index_select(0, index), y_h, self.config.metric,  # type: ignore[union-attr]
                              hidden.index_select(0, index))
        self._errors = verify_error(h_hat, h_hat).index_copy(0, index, errors)
        h_out = merge_rows(checked, y_h, h_hat)
        e_out = merge_rows(checked, y_e, e_hat) if y_e is not None and e_hat is not None else e_hat
        return io.pack(h_out, e_out)

    def _record(self, state: _ListState, hidden: torch.Tensor, encoder: torch.Tensor | None, *, split: bool,
                single: bool) -> None:
        outs = {"hidden": hidden, "encoder": encoder}
        pairs = anchor_pairs(split, single, state.inputs, state.tail_inputs, outs)
        for head, ins, outs_ in pairs:
            for stream in ("hidden", "encoder"):
                x_in, out = ins.get(stream), outs_.get(stream)
                if out is None or x_in is None or out.shape != x_in.shape:
                    continue
                self._forecaster(state, f"{head}:{stream}").update(self._x, out - x_in, self._record_rows)
        for name, value in state.tail_inputs.items() if split else ():  # the earlier-block inputs too (long skips)
            if name not in outs and isinstance(value, torch.Tensor):
                self._forecaster(state, f"tail:{name}").update(self._x, value, self._record_rows)
        state.inputs, state.tail_inputs = {}, {}
        state.encoder_out_none = encoder is None

    def _forecaster(self, state: _ListState, key: str) -> TaylorForecaster:
        f = state.forecasters.get(key)
        if f is None:
            f = state.forecasters[key] = TaylorForecaster(self._order, self.config.form)
        return f

    # ----------------------------------------------------------------- cache budget
    def _choose_cache(self) -> None:
        """Pick granularity and order from the anchors of the first step (every branch), drop the rest."""
        states = [ls for b in self._branches.values() for ls in b.lists]
        granularity, order, level = settle_cache([ls.forecasters for ls in states], self.config, self.module_ok)
        self.granularity, self._order = granularity, order
        self.stats.extra.update(granularity=granularity, order=order,
                                cache_level_gb={k: round(v / 1e9, 6) for k, v in level.items()})

    def _apply_raw(self, state: _ListState, key: str, x: Any) -> Any:
        """The forecast of a recorded block input itself (not a residual); ``x`` when none is recorded."""
        draft = state.drafts.pop(key, None)
        if not isinstance(x, torch.Tensor) or draft is None:
            return x
        return draft.to(x.dtype)

    def _apply(self, state: _ListState, key: str, x: torch.Tensor | None) -> torch.Tensor | None:
        draft = state.drafts.pop(key, None)
        if x is None or draft is None:
            return x
        return (x.float() + draft).to(x.dtype)
