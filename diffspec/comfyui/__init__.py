"""diffspec's ComfyUI node pack (V1 nodes).

ComfyUI imports a custom-node folder's ``__init__.py`` and reads ``NODE_CLASS_MAPPINGS`` and
``NODE_DISPLAY_NAME_MAPPINGS``; the repository root's ``__init__.py`` re-exports these. Nothing here
imports ``comfy`` at import time, and nothing needs diffusers: torch is enough.

Nodes: ``diffspec SpecA Forecast`` and ``diffspec Taylor Forecast`` (MODEL -> MODEL) and
``diffspec Forecast Stats`` (statistics of the latest sampling run); ``diffspec Speculative Sampler``
(a SAMPLER for ``SamplerCustom``: exact speculative ``euler_ancestral`` / ``ddpm``) and ``diffspec
Sampler Stats``.
"""

from .forecast import ComfyForecast
from .nodes import NODE_CLASS_MAPPINGS as _FORECAST_CLASSES
from .nodes import NODE_DISPLAY_NAME_MAPPINGS as _FORECAST_NAMES
from .nodes import ForecastStats, SpecaForecast, TaylorForecast
from .patching import BlockPatch, apply_forecast, find_block_lists, forecast_of
from .sampler import SpeculativeRun, sample_speculative
from .sampler_nodes import (
    SAMPLER_NODE_CLASS_MAPPINGS,
    SAMPLER_NODE_DISPLAY_NAME_MAPPINGS,
    SamplerStats,
    SpeculativeSamplerNode,
)

NODE_CLASS_MAPPINGS: dict[str, type] = {**_FORECAST_CLASSES, **SAMPLER_NODE_CLASS_MAPPINGS}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {**_FORECAST_NAMES, **SAMPLER_NODE_DISPLAY_NAME_MAPPINGS}

__all__ = [
    "NODE_CLASS_MAPPINGS",
    "NODE_DISPLAY_NAME_MAPPINGS",
    "BlockPatch",
    "ComfyForecast",
    "ForecastStats",
    "SpecaForecast",
    "SamplerStats",
    "SpeculativeRun",
    "SpeculativeSamplerNode",
    "TaylorForecast",
    "apply_forecast",
    "find_block_lists",
    "forecast_of",
    "sample_speculative",
]
