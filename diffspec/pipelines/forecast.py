"""Forecast methods on diffusers DiT pipelines (``taylor``, ``speca``)."""

from __future__ import annotations

from typing import Any

from ..api import SpeculativePipeline
from ..config import ForecastConfig, MethodConfig, SpecaConfig
from ..forecast.blocks import SUPPORTED_TRANSFORMERS
from ..forecast.calibrate import resolve_replay, resolve_thresholds
from ..forecast.compile import compile_blocks
from ..forecast.hooks import ForecastHooks


def _num_steps(pipe: Any) -> int | None:
    timesteps = getattr(pipe.scheduler, "timesteps", None)
    return len(timesteps) if timesteps is not None else None


class ForecastPipeline(SpeculativePipeline):
    """A diffusers pipeline whose transformer forecasts block outputs on most steps.

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
        self.hooks = ForecastHooks(pipe.transformer, config, self.stats, num_steps_fn=self._num_steps)
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
        transformer = getattr(target, "transformer", None)
        if transformer is None:
            raise ValueError(
                f"{type(target).__name__} has no `transformer` component (UNet pipelines are not supported "
                f"by {config.method!r}); supported transformers: {', '.join(SUPPORTED_TRANSFORMERS)}"
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
        compile_blocks(self.pipe.transformer, **compile_kwargs)
        return self

    def enable(self) -> None:
        self.hooks.attach()
        super().enable()

    def disable(self) -> None:
        self.hooks.detach()
        super().disable()

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        self.hooks.reset()
        return self.pipe(*args, **kwargs)
