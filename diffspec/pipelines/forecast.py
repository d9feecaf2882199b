"""Forecast methods on diffusers DiT pipelines (``taylor``, ``speca``)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..api import SpeculativePipeline
from ..config import ForecastConfig, MethodConfig, SpecaConfig
from ..forecast.calibrate import resolve_replay, resolve_thresholds
from ..forecast.compile import compile_blocks
from ..forecast.controlnet import ControlNetForecast
from ..forecast.hooks import ForecastHooks
from ..forecast.profiles import profile_of, supported
from ..forecast.steps import StepTracker

DENOISERS = ("transformer", "transformer_2", "unconditional_transformer")
"""Pipeline components forecast alike, each with its own hooks on one shared step count: Wan 2.2's low-noise
expert ``transformer_2`` (``WanPipeline``, ``WanImageToVideoPipeline``, ``WanVACEPipeline``, ``LucyEditPipeline``)
and Ideogram 4's ``unconditional_transformer`` (its CFG branch)."""


def denoisers(pipe: Any) -> list[tuple[str, nn.Module]]:
    """The pipeline's transformers in :data:`DENOISERS`, by component name (those set, in that order)."""
    return [(name, m) for name in DENOISERS if isinstance(m := getattr(pipe, name, None), nn.Module)]


def _num_steps(pipe: Any) -> int | None:
    timesteps = getattr(pipe.scheduler, "timesteps", None)
    return len(timesteps) if timesteps is not None else None


class ForecastPipeline(SpeculativePipeline):
    """A diffusers pipeline whose transformer forecasts block outputs on most steps.

    Every transformer of :data:`DENOISERS` the pipeline has is forecast (Wan 2.2 A14B's two experts: each
    starts with its own warmup where it takes over), with one :class:`~diffspec.stats.SpecStats` for all. A
    ``controlnet`` component runs in full only on the transformer's full steps (with a verified ``speca``: also on its
    checked drafts) and its outputs are forecast on the others (:mod:`diffspec.forecast.controlnet`).

    Example:
        >>> spec = SpeculativePipeline.from_pipe(pipe, method="taylor", interval=5)  # doctest: +SKIP
        >>> out = spec(class_labels=[1], num_inference_steps=50)  # doctest: +SKIP
        >>> out.spec_stats.forecast_steps  # doctest: +SKIP
    """

    family = "diffusion"

    def __init__(self, pipe: Any, config: ForecastConfig | SpecaConfig) -> None:
        self.threshold_source: str | None = None
        self.schedule_source: str | None = None  # the calibration file a replay_full_steps schedule came from
        self.schedule_steps: int | None = None  # the inference steps that schedule was searched for
        if isinstance(config, SpecaConfig):
            folder = getattr(pipe, "name_or_path", None)
            config, self.schedule_source, self.schedule_steps = resolve_replay(config, folder)
            config, self.threshold_source = resolve_thresholds(config, folder)
        super().__init__(pipe, config)
        models = denoisers(pipe)
        tracker = StepTracker(increasing=profile_of(models[0][1]).increasing_timesteps)
        self.hooks = {name: ForecastHooks(model, config, self.stats, num_steps_fn=self._num_steps, tracker=tracker)
                      for name, model in models}
        """One :class:`~diffspec.forecast.hooks.ForecastHooks` per denoiser, by component name."""
        controlnet = getattr(pipe, "controlnet", None)
        plan = None if ControlNetForecast.applies(config) else self.hooks[models[0][0]].certain_draft
        self.controlnet_forecast = (
            ControlNetForecast(controlnet, config, self.stats, num_steps_fn=self._num_steps,
                               increasing=tracker.increasing, plan=plan)
            if ControlNetForecast.supports(controlnet) else None)
        """Forecasts ``pipe.controlnet``'s outputs where the transformer surely drafts (None: no ControlNet)."""
        self.enable()

    def _num_steps(self) -> int | None:
        """Transformer steps of the current generation; a calibrated schedule only replays at its own count."""
        n = _num_steps(self.pipe)
        if self.schedule_steps is not None and n is not None and n != self.schedule_steps:
            raise ValueError(f"num_inference_steps={n}: the schedule of replay_full_steps={len(self.config.replay_steps)} "
                             f"({self.schedule_source}) was searched for {self.schedule_steps} steps; call with "
                             f"num_inference_steps={self.schedule_steps}, or calibrate for {n} "
                             f"(`diffspec calibrate --steps {n} --schedules ...`)")
        return n

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig) -> ForecastPipeline:
        if not denoisers(target):
            raise ValueError(
                f"{type(target).__name__} has no `transformer` component (UNet pipelines are not supported "
                f"by {config.method!r}); supported transformers: {', '.join(supported())}"
            )
        if not isinstance(config, (ForecastConfig, SpecaConfig)):
            raise ValueError(f"{type(config).__name__} is not a forecast config")
        return cls(target, config)

    def compile(self, **compile_kwargs: Any) -> ForecastPipeline:
        """Compile the transformer blocks (regional ``torch.compile``); returns ``self``.

        ``compile_kwargs`` go to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``...). The
        forecast decisions stay outside the compiled blocks: after a first generation, another one
        with the same shapes compiles nothing new. :meth:`disable` leaves the blocks compiled. Same effect as diffusers'
        ``pipe.transformer.compile_repeated_blocks()``, also for models without ``_repeated_blocks``
        (see :mod:`diffspec.forecast.compile`).

        Example:
            >>> spec = SpeculativePipeline.from_pipe(pipe, method="taylor").compile()  # doctest: +SKIP
        """
        for _, model in denoisers(self.pipe):
            compile_blocks(model, **compile_kwargs)
        return self

    def _attached(self) -> list[ForecastHooks | ControlNetForecast]:
        return [*self.hooks.values(), *([self.controlnet_forecast] if self.controlnet_forecast else [])]

    def enable(self) -> None:
        """Attach every denoiser's hooks (and the ControlNet's), all or none.

        Raises:
            ValueError: another wrapper's hooks hold one of these modules (call its ``disable()`` first).
        """
        started: list[ForecastHooks | ControlNetForecast] = []
        try:
            for hooks in self._attached():
                if not hooks.attached:
                    started.append(hooks)  # before attach: one that fails half way is detached too
                    hooks.attach()
        except Exception:
            for hooks in reversed(started):
                hooks.detach()
            raise
        super().enable()

    def disable(self) -> None:
        for hooks in self._attached():
            hooks.detach()
        super().disable()

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        for hooks in self._attached():
            hooks.reset()
        return self.pipe(*args, **kwargs)
