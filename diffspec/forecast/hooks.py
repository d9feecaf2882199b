"""Attaching the forecast engine (:mod:`~.engine`) to a diffusers transformer.

Each block's ``forward`` is replaced on the instance by a :class:`BlockWrapper` (removed again by
:meth:`ForecastHooks.detach`, which restores the original behaviour bit for bit); the transformer's
pre-hook plans each call and its post-hook recomputes the rows the verifier sends back and records
the anchors. What a model needs beyond discovery is in its :class:`~.profiles.ModelProfile`.

Steps and CFG branches are detected from the ``timestep`` argument of the transformer, so no
``cache_context`` is needed: a new value is a new step, a repeated value within a step is the
next CFG branch (pipelines that call the transformer once per branch), an increase starts a new
generation (a decrease, for the transformers fed ``1 - sigma``: the profile's ``increasing_timesteps``). A
change of the token count (latent or text) resets that branch instead of failing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..config import ForecastConfig, SpecaConfig
from ..stats import SpecStats
from .blocks import HIDDEN_ARGS, BlockIO, find_block_lists
from .budget import settle_cache
from .claims import claim, release
from .compile import BlockForward, CompiledCalls
from .engine import BlockPosition, Branch, ForecastCall, ForecastEngine
from .modules import check_module_support, supports_modules, wrap_submodules
from .profiles import block_profile, profile_of
from .rows import merge_rows, take_call_rows
from .steps import TIMESTEP_ARGS, StepTracker


class ForecastHooks(ForecastEngine):
    """Block-level forecasting (``taylor``) and verified forecasting (``speca``) on one transformer.

    Each call is planned per batch row (:class:`~.gate.Schedule`). If every row is full, the call runs
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
        self.calls = CompiledCalls(transformer)
        self.profile = profile_of(self.calls.model)
        self.block_lists = find_block_lists(self.calls.model, config.blocks)
        super().__init__(config, stats, [len(blocks) for _, blocks in self.block_lists])
        self.num_steps_fn = num_steps_fn or (lambda: None)
        self._base_schedule = self.schedule  # placed per generation (for_steps), once its step count is known
        blocks = [b for _, bl in self.block_lists for b in bl]
        if config.granularity == "module":
            check_module_support(blocks)
        self.module_ok = all(supports_modules(b) for b in blocks)
        self._decide_cache = config.granularity == "auto" or config.max_cache_gb is not None
        # self.granularity: "block", "module", or "pending" (measured at step 0, chosen at step 1)
        increasing = self.profile.increasing_timesteps
        if tracker is not None and tracker.increasing != increasing:
            raise ValueError(f"{self.profile.name}: a shared step tracker must read timesteps the same way "
                             f"(increasing={tracker.increasing}, this transformer: {increasing})")
        self.tracker = tracker or StepTracker(increasing=increasing)
        self._generation = self.tracker.generation  # the last generation these hooks were called in
        self._first_step = 0  # the step of this generation at which this transformer was first called
        self._params = list(inspect.signature(self.calls.model.forward).parameters)
        self._timestep_name = next((n for n in TIMESTEP_ARGS if n in self._params), "timestep")
        self._hidden_name = next((n for n in HIDDEN_ARGS if n in self._params), "hidden_states")
        self._handles: list[Any] = []
        self._patched: list[tuple[nn.Module, Any]] = []  # (module, the instance forward it had before, or None)
        self._num_steps: int | None = None

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
        claim(self.calls.model, self, self.config.method, self.profile.name)
        pre, post = torch.compiler.disable(self._pre_forward), torch.compiler.disable(self._post_forward)
        self._handles.append(self.transformer.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(self.transformer.register_forward_hook(post, with_kwargs=True))
        for li, (name, blocks) in enumerate(self.block_lists):
            split = self.verify and li == len(self.block_lists) - 1
            for bi, block in enumerate(blocks):
                at = BlockPosition(li, bi, first=bi == 0, last=bi == len(blocks) - 1, split=split,
                                   side_only=name in self.profile.side_output_lists)
                self._patch(block, BlockWrapper(self, block, at, self.calls.block_forward(block)))
                if self.module_ok and self.config.granularity != "block":
                    self._patched.extend(wrap_submodules(self, block, li, bi, self.calls.submodule_forward))
        for name in self.profile.interleaved_modules:
            for module in getattr(self.calls.model, name):
                self._patch(module, InterleavedWrapper(self, module.forward))

    def _patch(self, module: nn.Module, forward: Callable[..., Any]) -> None:
        """Set ``forward`` on ``module``, keeping the instance forward it had (accelerate's offload hook) to restore."""
        self._patched.append((module, module.__dict__.get("forward")))
        module.forward = forward

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
        self.branches.clear()
        self.call = None
        self._num_steps = None

    def certain_draft(self, step: int) -> bool:
        """Whether this transformer's call at ``step`` (the next one) drafts every row of every CFG branch without a
        check: what a ControlNet called before it may rely on (:mod:`~.controlnet`). False before its first call of
        a generation."""
        if not self.branches or self.tracker.step != step - 1:
            return False
        sched, n = self.schedule, self._num_steps
        return all(not forced and since is not None and not sched.forced_full(step, n, since, self._first_step)
                   and not sched.checked(since)
                   for branch in self.branches.values() for since, forced in zip(branch.since_full, branch.force_full))

    # ----------------------------------------------------------------- transformer hooks
    def _arg(self, name: str, args: tuple, kwargs: dict) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = self._params.index(name) if name in self._params else None
        return args[i] if i is not None and i < len(args) else None

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        for name, why in self.profile.refused_args.items():
            if self._arg(name, args, kwargs) is not None:
                raise ValueError(f"{self.profile.name}: {name} is not supported with block forecasting: {why}")
        self.calls.borrow()
        t = self.tracker.read(self._arg(self._timestep_name, args, kwargs))
        self.tracker.observe(t)
        if self.tracker.generation != self._generation:  # a new generation (seen here or by a shared tracker)
            self._start_generation()
        if self.granularity == "pending" and self.tracker.step > self._first_step:
            self._choose_cache()
        branch, per_row_lists = self._branch_of(args, kwargs)
        call = self._plan(branch, self.tracker.step, self._num_steps, t, self.schedule, self._first_step)
        call.per_row_lists = per_row_lists
        call.residuals_between = any(self._arg(n, args, kwargs) is not None for n in self.profile.between_block_args)
        if call.mode == "draft":
            # lists as passed: a model may consume one (HunyuanDiT pops its ControlNet samples); a recompute gets them whole
            call.lists_as_passed = ({i: list(a) for i, a in enumerate(args) if isinstance(a, list)},
                                    {k: list(v) for k, v in kwargs.items() if isinstance(v, list)})
        for state in branch.lists:  # forecasts made here, outside any compiled region
            state.drafts = {k: f.forecast(call.x) for k, f in state.forecasters.items()} if call.mode == "draft" else {}

    def _start_generation(self) -> None:
        self._generation, self._first_step = self.tracker.generation, self.tracker.step
        self.branches.clear()
        self._num_steps = self.num_steps_fn()
        self.schedule = self._base_schedule.for_steps(self._num_steps)
        self.schedule.check_steps(self._num_steps)
        self.order = self.config.order
        self.granularity = "pending" if self._decide_cache else self.config.granularity

    def _branch_of(self, args: tuple, kwargs: dict) -> tuple[Branch, bool]:
        """The CFG branch of this call (a new one where the latent or text shape changed), and whether the latents
        come as a list of per-row tensors (Z-Image)."""
        hidden = self._arg(self._hidden_name, args, kwargs)
        per_row_lists = isinstance(hidden, list) and all(isinstance(h, torch.Tensor) for h in hidden)
        if per_row_lists:  # (rows, each row's shape...)
            shape = (len(hidden), *(tuple(h.shape) for h in hidden))
        else:
            shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else None
        # the text's shape too: Bria FIBO 2.0 derives its gist-token count from the prompt's length
        text = self._arg("encoder_hidden_states", args, kwargs)
        key = (shape, tuple(text.shape) if isinstance(text, torch.Tensor) else None)
        branch = self.branches.get(self.tracker.branch)
        if branch is None or branch.key != key:  # new branch, or token count / batch changed
            branch = self.branches[self.tracker.branch] = self._new_branch(shape[0] if shape else 1, key)
        return branch, per_row_lists

    def _post_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        call = self.call
        assert call is not None
        recompute = list(call.full_rows) if call.is_draft else [True] * len(call.full_rows)
        if call.is_draft:
            self._decide(recompute, self.tracker.step)
            if any(recompute):  # planned-full rows and strict rejections: one full pass over just those rows
                output = self._recompute(module, args, kwargs, recompute, output)
        self._finish(recompute, recompute.count(True) / len(recompute))  # rows computed in full, per row
        self._count_step(recompute)
        return output

    def _count_step(self, recompute: list[bool]) -> None:
        """Count the call's step and branch (SpecStats ``steps``, ``branches``) and, with a verifier, where the gate
        put its full steps: rows computed in full, per step (summed over calls)."""
        stats, step = self.stats, self.tracker.step
        if self.tracker.branch == 0:
            stats.steps += 1
        stats.branches = max(stats.branches, self.tracker.branch + 1)
        if self.verify:
            by_step = stats.extra.setdefault("full_by_step", [])
            calls = stats.extra.setdefault("calls_by_step", [])
            by_step.extend([0.0] * (step + 1 - len(by_step)))
            calls.extend([0] * (step + 1 - len(calls)))
            by_step[step] += recompute.count(True) / len(recompute)
            calls[step] += 1

    def _recompute(self, module: nn.Module, args: tuple, kwargs: dict, recompute: list[bool], drafted: Any) -> Any:
        """Run the transformer in full on the rows to recompute and merge them into the drafted output."""
        call = self.call
        assert call is not None
        call.mode = "full"
        listed, listed_kw = call.lists_as_passed
        args = tuple(list(listed[i]) if i in listed else a for i, a in enumerate(args))
        kwargs = {k: list(listed_kw[k]) if k in listed_kw else v for k, v in kwargs.items()}
        if all(recompute):
            call.record_rows = None
            return self.calls.forward(module)(*args, **kwargs)
        rows = [r for r, full in enumerate(recompute) if full]
        index = torch.tensor(rows)
        call.record_rows = rows
        if self.profile.batch_coupled:  # the whole batch, only ``rows`` kept
            return merge_rows(index, self.calls.forward(module)(*args, **kwargs), drafted, call.per_row_lists)
        sub_args, sub_kwargs = take_call_rows(args, kwargs, self._params, index, len(recompute), call.per_row_lists,
                                              unbatched=self.profile.unbatched_args)
        return merge_rows(index, self.calls.forward(module)(*sub_args, **sub_kwargs), drafted, call.per_row_lists)

    # ----------------------------------------------------------------- module granularity (:mod:`~.modules`)
    def module_forecaster(self, list_index: int, key: str) -> Any:
        """The forecaster of submodule anchor ``key`` (``"m{block}.{name}.{part}"``) in the current branch, or None."""
        return self.call.branch.lists[list_index].forecasters.get(key)  # type: ignore[union-attr]

    def record_module(self, list_index: int, key: str, value: torch.Tensor) -> None:
        """Record a submodule output as an anchor of the current full pass."""
        call = self.call
        self._forecaster(call.branch.lists[list_index], key).update(call.x, value, call.record_rows)  # type: ignore[union-attr]

    def module_forecast(self, list_index: int, key: str, like: torch.Tensor) -> torch.Tensor:
        """A submodule's forecast output on a draft (made by the pre-hook when ready), in ``like``'s dtype."""
        state = self.call.branch.lists[list_index]  # type: ignore[union-attr]
        draft = state.drafts.pop(key, None) if state.drafts is not None else None
        if draft is None:
            draft = state.forecasters[key].forecast(self.call.x)  # type: ignore[union-attr]
        return draft.to(like.dtype)

    def _choose_cache(self) -> None:
        """Pick granularity and order from the anchors of the first step (every branch), drop the rest."""
        states = [ls for b in self.branches.values() for ls in b.lists]
        granularity, order, level = settle_cache([ls.forecasters for ls in states], self.config, self.module_ok)
        self.granularity, self.order = granularity, order
        self.stats.extra.update(granularity=granularity, order=order,
                                cache_level_gb={k: round(v / 1e9, 6) for k, v in level.items()})


class BlockWrapper:
    """A block's ``forward`` while the hooks are attached: the engine's step for its position in the current call
    (at module granularity, a draft runs the block with forecast submodules, or its profile's ``draft_forward``).

    Args:
        hooks: the hooks whose current call it follows.
        block: the wrapped block.
        at: its position.
        original: its own forward (compiled like the block when the block is).
    """

    def __init__(self, hooks: ForecastHooks, block: nn.Module, at: BlockPosition, original: BlockForward) -> None:
        self.hooks, self.block, self.at, self.original = hooks, block, at, original
        self.io = BlockIO.for_block(block, original, hooks.profile.unbatched_args)
        self.draft_forward = block_profile(block).draft_forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hooks, call = self.hooks, self.hooks.call
        if call is None:
            return self.original(*args, **kwargs)
        call.between_blocks = not self.at.last
        if call.mode == "draft" and hooks.granularity == "module" and not self.at.side_only:
            return self._module_draft(call, args, kwargs)
        return hooks.run_block(self.at, self.io, self.original, args, kwargs)

    def _module_draft(self, call: ForecastCall, args: tuple, kwargs: dict) -> Any:
        """The block on a module-granularity draft (its submodules return forecasts); the verified last block is
        checked against its real run on the same inputs."""
        if self.draft_forward is None:
            out = self.original(*args, **kwargs)
        else:
            out = self.draft_forward(self.hooks, self.block, self.at.list_index, self.at.block_index,
                                     **self.io.as_kwargs(args, kwargs))
        if not (self.at.last and self.at.split):
            return out
        return self.hooks.verify_block(self.io, self.original, args, kwargs, self.io.outputs(out),
                                       self.io.streams(args, kwargs), replace=None)


class InterleavedWrapper:
    """A module the model runs between two blocks of a list, adding its output to the stream (the profile's
    ``interleaved_modules``): on a block-granularity draft it returns zeros shaped like its ``hidden_states`` there,
    its part being in the list's forecast residual; one after a list's last block runs as usual."""

    def __init__(self, hooks: ForecastHooks, original: Callable[..., Any]) -> None:
        self.hooks, self.original = hooks, original
        self.signature = inspect.signature(original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.hooks.call
        if call is not None and call.mode == "draft" and self.hooks.granularity != "module" and call.between_blocks:
            return torch.zeros_like(self.signature.bind(*args, **kwargs).arguments["hidden_states"])
        return self.original(*args, **kwargs)
