"""Attaching block forecasting to a diffusers transformer.

Each block's ``forward`` is replaced on the instance (removed again by :meth:`detach`, which
restores the original behaviour bit for bit). On a full step every block runs and the residual
``out - in`` of each block list (per stream: image tokens, and text tokens where a list outputs
them) is stored as an anchor. On a forecast step no block runs: the first block of each list
returns ``in + forecast(residual)`` and the other blocks pass their inputs through.

Steps and CFG branches are detected from the ``timestep`` argument of the transformer, so no
``cache_context`` is needed: a new value is a new step, a repeated value within a step is the
next CFG branch (pipelines that call the transformer once per branch), an increase starts a new
generation. A change of the token count resets that branch instead of failing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import ForecastConfig
from ..stats import SpecStats
from .blocks import BlockIO, find_block_lists
from .taylor import TaylorForecaster

StepPolicy = Callable[[int, "int | None"], bool]
"""``policy(step, num_steps) -> True`` if the step must run in full."""


def interval_policy(cfg: ForecastConfig) -> StepPolicy:
    """TaylorSeer's fixed schedule, aligned with diffusers' ``TaylorSeerCacheConfig``.

    Full while ``step < warmup``, then every ``interval`` steps starting at ``warmup + 1``; the
    last step is full when ``last_step_full`` and the step count is known.
    """

    def policy(step: int, num_steps: int | None) -> bool:
        if step < cfg.warmup:
            return True
        if cfg.last_step_full and num_steps is not None and step >= num_steps - 1:
            return True
        return (step - cfg.warmup - 1) % cfg.interval == 0

    return policy


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


@dataclass
class _ListState:
    forecasters: dict[str, TaylorForecaster] = field(default_factory=dict)
    inputs: dict[str, torch.Tensor | None] = field(default_factory=dict)
    encoder_out_none: bool = False  # the list's last block returns no text stream (SD3's last block)


@dataclass
class _BranchState:
    lists: list[_ListState]
    input_shape: tuple | None = None

    @property
    def ready(self) -> bool:
        return all(ls.forecasters and all(f.num_anchors for f in ls.forecasters.values()) for ls in self.lists)


class ForecastHooks:
    """Block-level forecasting on one transformer.

    Args:
        transformer: a diffusers transformer (``DiTTransformer2DModel``, ``FluxTransformer2DModel``...).
        config: the forecast config.
        stats: counters to update (``full_steps``, ``forecast_steps``, ``target_calls``...).
        num_steps_fn: returns the number of transformer steps of the current generation
            (e.g. ``len(pipe.scheduler.timesteps)``), or None if unknown.
        policy: decides full vs forecast per step; default :func:`interval_policy`.

    Example:
        >>> hooks = ForecastHooks(pipe.transformer, ForecastConfig(), SpecStats())  # doctest: +SKIP
        >>> hooks.attach(); ...; hooks.detach()  # doctest: +SKIP
    """

    def __init__(
        self,
        transformer: nn.Module,
        config: ForecastConfig,
        stats: SpecStats,
        num_steps_fn: Callable[[], int | None] | None = None,
        policy: StepPolicy | None = None,
    ) -> None:
        self.transformer = transformer
        self.config = config
        self.stats = stats
        self.num_steps_fn = num_steps_fn or (lambda: None)
        self.policy = policy or interval_policy(config)
        self.block_lists = find_block_lists(transformer)
        self.tracker = StepTracker()
        self._params = list(inspect.signature(transformer.forward).parameters)
        self._handles: list[Any] = []
        self._patched: list[nn.Module] = []
        self._branches: dict[int, _BranchState] = {}
        self._num_steps: int | None = None
        self.full = True
        self._x = 0.0
        self._branch: _BranchState | None = None
        self._peak_bytes = 0

    # ----------------------------------------------------------------- lifecycle
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self) -> None:
        """Install the hooks (idempotent)."""
        if self.attached:
            return
        self._handles.append(self.transformer.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
        self._handles.append(self.transformer.register_forward_hook(self._post_forward))
        for li, (_, blocks) in enumerate(self.block_lists):
            last = len(blocks) - 1
            for bi, block in enumerate(blocks):
                block.forward = self._wrap(block, li, first=bi == 0, last=bi == last)
                self._patched.append(block)

    def detach(self) -> None:
        """Remove every hook and wrapper; the transformer behaves as if never wrapped."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for block in self._patched:
            if "forward" in block.__dict__:
                del block.forward
        self._patched.clear()
        self.reset()

    def reset(self) -> None:
        """Forget all anchors and the step position (a new generation follows)."""
        self.tracker.reset()
        self._branches.clear()
        self._num_steps = None

    # ----------------------------------------------------------------- transformer hooks
    def _arg(self, name: str, args: tuple, kwargs: dict) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = self._params.index(name) if name in self._params else None
        return args[i] if i is not None and i < len(args) else None

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        t = timestep_value(self._arg("timestep", args, kwargs))
        if self.tracker.observe(t):
            self._branches.clear()
            self._num_steps = self.num_steps_fn()
        step = self.tracker.step
        hidden = self._arg("hidden_states", args, kwargs)
        shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else None
        branch = self._branches.get(self.tracker.branch)
        if branch is None or branch.input_shape != shape:  # new branch, or token count changed
            branch = _BranchState([_ListState() for _ in self.block_lists], shape)
            self._branches[self.tracker.branch] = branch
        self._branch = branch
        self._x = float(step) if self.config.abscissa == "index" else t
        self.full = self.policy(step, self._num_steps) or not branch.ready

    def _post_forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.full:
            self.stats.full_steps += 1
            self.stats.target_calls += 1
            self.stats.target_evals += 1
            held = sum(f.nbytes for b in self._branches.values() for ls in b.lists for f in ls.forecasters.values())
            self._peak_bytes = max(self._peak_bytes, held)
            self.stats.extra_mem_gb = self._peak_bytes / 1e9
        else:
            self.stats.forecast_steps += 1
            self.stats.draft_calls += 1
            self.stats.accepted += 1
            self.stats.proposed += 1

    # ----------------------------------------------------------------- block wrapper
    def _wrap(self, block: nn.Module, list_index: int, first: bool, last: bool) -> Callable[..., Any]:
        original = block.forward
        io = BlockIO.for_block(block, original)
        hooks = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            hidden = io.arg("hidden_states", args, kwargs)
            encoder = io.arg("encoder_hidden_states", args, kwargs)
            state = hooks._branch.lists[list_index] if hooks._branch is not None else None
            if hooks.full or state is None:
                if first and state is not None:
                    state.inputs = {"hidden": hidden, "encoder": encoder}
                out = original(*args, **kwargs)
                if last and state is not None:
                    hooks._record(state, *io.split_output(out))
                elif io.returns_tensor is None:
                    io.split_output(out)  # learn the layout for forecast steps
                return out
            if first:
                hidden = hooks._apply(state, "hidden", hidden)
                encoder = hooks._apply(state, "encoder", encoder)
            if last and state.encoder_out_none:
                encoder = None
            return io.pack(hidden, encoder)

        return forward

    def _record(self, state: _ListState, hidden: torch.Tensor, encoder: torch.Tensor | None) -> None:
        outs = {"hidden": hidden, "encoder": encoder}
        ins = state.inputs
        for stream, out in outs.items():
            x_in = ins.get(stream)
            if out is None or x_in is None or out.shape != x_in.shape:
                continue
            f = state.forecasters.get(stream)
            if f is None:
                f = state.forecasters[stream] = TaylorForecaster(self.config.order, self.config.form)
            f.update(self._x, out - x_in)
        state.inputs = {}
        state.encoder_out_none = encoder is None

    def _apply(self, state: _ListState, stream: str, x: torch.Tensor | None) -> torch.Tensor | None:
        f = state.forecasters.get(stream)
        if x is None or f is None:
            return x
        return (x.float() + f.forecast(self._x)).to(x.dtype)
