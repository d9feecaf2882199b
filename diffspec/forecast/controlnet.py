"""Forecasting a ControlNet's outputs on the steps where its transformer forecasts.

A diffusers ControlNet (``pipe.controlnet``: FLUX, SD3, Qwen-Image, Sana, HunyuanDiT, Z-Image...) runs once per step
before the transformer, and the transformer adds its residuals to the stream. On a draft step the transformer's list
forecast already holds those added inside each block list, but the ones added after a list's last block are still
read, so the ControlNet cannot just be skipped: without this module it runs in full on every step, which on FLUX with a
Union ControlNet (5 double and 10 single blocks) costs about a quarter of a full transformer step each time.

With a schedule fixed before the transformer is called (``taylor``; ``speca`` replaying ``replay_steps`` or with
``tau0=inf``), :class:`ControlNetForecast` runs the ControlNet in full on the same steps (same schedule, same
timesteps) and forecasts every tensor it returns on the others, with the transformer's order, form and abscissa. A
verified ``speca`` decides after the ControlNet has run, and a checked draft may be recomputed in full, which needs the
ControlNet's true outputs: there the ControlNet is forecast only on the steps where the transformer's next call
drafts every row without a check (``plan``: :meth:`~.hooks.ForecastHooks.certain_draft`; ``k_min`` of them after
each full step) and runs everywhere else. A step whose ControlNet call differs in anything but the timestep and the
tensors' values (the conditioning scale that ``control_guidance_start`` / ``control_guidance_end`` switch, an input
shape) restarts the anchors and the warmup. (A row recomputed because its draft was not finite gets the forecast
ControlNet outputs of that step.)
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import ForecastConfig, SpecaConfig
from ..stats import SpecStats
from .claims import claim, release
from .gate import Schedule
from .steps import TIMESTEP_ARGS, StepTracker
from .taylor import TaylorForecaster


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``obj`` with ``fn`` applied to each tensor it holds (tuples, lists, dicts, dataclass outputs such as
    diffusers' ``BaseOutput``, nested), in a fixed order; other values are kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj)(**{f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(map_tensors(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, map_tensors(v, fn)) for k, v in obj.items())
    return obj


def call_key(value: Any) -> Any:
    """What must not change between a ControlNet's anchors: tensors by shape and dtype (never their values: no host
    read), containers item by item, anything else by ``repr``."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(call_key(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, call_key(v)) for k, v in value.items())
    return repr(value)


@dataclass
class _BranchState:
    key: Any  # call_key of the call's arguments but the timestep
    first_step: int  # the step these anchors started at (their warmup counts from it)
    since_full: int | None = None  # drafts since the last full call (None: none yet)
    template: Any = None  # the last full output (its structure; its tensors are anchors)
    forecasters: list[TaylorForecaster] = field(default_factory=list)  # one per output tensor, in map_tensors order


class ControlNetForecast:
    """Runs a ControlNet in full only on the full steps of a fixed schedule and forecasts its outputs on the others.

    Args:
        controlnet: the pipeline's ControlNet (``FluxControlNetModel``, ``FluxMultiControlNetModel``,
            ``SD3ControlNetModel``...): any module whose forward takes the step's timestep.
        config: the transformer's :class:`ForecastConfig` or unverified :class:`SpecaConfig`.
        stats: the pipeline's counters; ``extra["controlnet_full"]`` / ``["controlnet_forecast"]`` count its calls
            and ``extra["controlnet_cache_gb"]`` the anchors it holds.
        num_steps_fn: the generation's step count (as for the transformer's hooks).
        increasing: the pipeline's timesteps grow over a generation (the model profile's ``increasing_timesteps``).
        plan: for a verified ``speca``: ``plan(step)`` tells whether the transformer's call at ``step`` certainly
            drafts (:meth:`~.hooks.ForecastHooks.certain_draft`); the ControlNet runs in full where it does not.

    Raises:
        ValueError: a verified ``speca`` config without ``plan`` (its full steps are decided after the ControlNet
            runs), or a ControlNet whose forward takes no timestep.

    Example:
        >>> forecast = ControlNetForecast(pipe.controlnet, ForecastConfig(), stats)  # doctest: +SKIP
        >>> forecast.attach(); pipe(...); forecast.detach()  # doctest: +SKIP
    """

    def __init__(self, controlnet: nn.Module, config: ForecastConfig | SpecaConfig, stats: SpecStats,
                 num_steps_fn: Callable[[], int | None] | None = None, increasing: bool = False,
                 plan: Callable[[int], bool] | None = None) -> None:
        if plan is None and not self.applies(config):
            raise ValueError(f"ControlNetForecast needs a schedule fixed before the transformer call, or a plan; "
                             f"{config.method!r} with a verifier decides after the ControlNet runs")
        self.plan = plan
        self.controlnet = controlnet
        self.config = config
        self.stats = stats
        self.num_steps_fn = num_steps_fn or (lambda: None)
        self._base = Schedule.of(config)
        self.schedule = self._base
        self.tracker = StepTracker(increasing=increasing)
        self._signature = inspect.signature(type(controlnet).forward.__get__(controlnet))  # not a wrapper's
        timestep = next((n for n in TIMESTEP_ARGS if n in self._signature.parameters), None)
        if timestep is None:
            raise ValueError(f"{type(controlnet).__name__}.forward takes no timestep argument ({', '.join(TIMESTEP_ARGS)})")
        self._timestep = timestep
        self._num_steps: int | None = None
        self._branches: dict[int, _BranchState] = {}
        self._wrapper: Callable[..., Any] | None = None  # our forward, while attached
        self._previous: Callable[..., Any] | None = None  # the instance forward it replaced, if any

    @staticmethod
    def supports(controlnet: Any) -> bool:
        """Whether ``controlnet`` is a module whose forward takes the step's timestep (every diffusers ControlNet a
        transformer pipeline calls does)."""
        if not isinstance(controlnet, nn.Module):
            return False
        params = inspect.signature(type(controlnet).forward).parameters
        return any(n in params for n in TIMESTEP_ARGS)

    @staticmethod
    def applies(config: ForecastConfig | SpecaConfig) -> bool:
        """Whether ``config``'s full steps are known before the transformer call (no verifier: no ``plan`` needed)."""
        return not Schedule.of(config).verify

    @property
    def attached(self) -> bool:
        return self._wrapper is not None

    def attach(self) -> None:
        """Wrap the ControlNet's ``forward`` (idempotent; an instance ``forward`` already there, such as accelerate's
        offload hook, runs inside the wrapper and is put back by :meth:`detach`).

        Raises:
            ValueError: other diffspec hooks hold the ControlNet (:mod:`~.claims`); nothing is installed.
        """
        if self.attached:
            return
        claim(self.controlnet, self, self.config.method, type(self.controlnet).__name__)
        self._previous = self.controlnet.__dict__.get("forward")
        original = self.controlnet.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._forward(original, args, kwargs)

        self.controlnet.forward = self._wrapper = forward

    def detach(self) -> None:
        """Restore the ControlNet's ``forward`` as it was and forget every anchor."""
        if self.attached:
            if self._previous is not None:
                self.controlnet.forward = self._previous
            elif "forward" in self.controlnet.__dict__:
                del self.controlnet.forward
            self._wrapper = self._previous = None
            release(self.controlnet, self)
        self.reset()

    def reset(self) -> None:
        """Forget every anchor and the step position (a new generation follows)."""
        self.tracker.reset()
        self._branches.clear()

    def _forward(self, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        arguments = self._signature.bind(*args, **kwargs).arguments
        t = self.tracker.read(arguments.get(self._timestep))
        if self.tracker.observe(t):
            self._branches.clear()
            self._num_steps = self.num_steps_fn()
            self.schedule = self._base.for_steps(self._num_steps)
        step = self.tracker.step
        key = call_key({k: v for k, v in arguments.items() if k != self._timestep})
        state = self._branches.get(self.tracker.branch)
        if state is None or state.key != key:  # first call, or the call changed: restart the anchors
            state = self._branches[self.tracker.branch] = _BranchState(key, step)
        x = float(step) if self.config.abscissa == "index" else t
        extra = self.stats.extra
        if (self.schedule.forced_full(step, self._num_steps, state.since_full, state.first_step)
                or (self.plan is not None and not self.plan(step))):
            out = original(*args, **kwargs)
            if not state.forecasters:
                map_tensors(out, lambda _: state.forecasters.append(
                    TaylorForecaster(self.config.order, self.config.form)))
            anchors = iter(state.forecasters)
            map_tensors(out, lambda tensor: next(anchors).update(x, tensor))
            # the structure copied: a transformer may consume the lists it is given (HunyuanDiT pops its samples)
            state.template, state.since_full = map_tensors(out, lambda tensor: tensor), 0
            extra["controlnet_full"] = extra.get("controlnet_full", 0) + 1
            held = sum(f.nbytes for s in self._branches.values() for f in s.forecasters)
            extra["controlnet_cache_gb"] = max(extra.get("controlnet_cache_gb", 0.0), round(held / 1e9, 6))
            return out
        forecasts: Iterator[TaylorForecaster] = iter(state.forecasters)
        state.since_full += 1  # type: ignore[operator]
        extra["controlnet_forecast"] = extra.get("controlnet_forecast", 0) + 1
        return map_tensors(state.template, lambda tensor: next(forecasts).forecast(x).to(tensor.dtype))
