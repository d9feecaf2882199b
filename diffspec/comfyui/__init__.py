"""diffspec's ComfyUI node pack (V1 nodes).

ComfyUI imports a custom-node folder's ``__init__.py`` and reads ``NODE_CLASS_MAPPINGS`` and
``NODE_DISPLAY_NAME_MAPPINGS``; the repository root's ``__init__.py`` re-exports these. Nothing here
imports ``comfy`` at import time, and nothing needs diffusers: torch is enough.

Nodes: ``diffspec SpecA Forecast`` and ``diffspec Taylor Forecast`` (MODEL -> MODEL) and
``diffspec Forecast Stats`` (statistics of the latest sampling run). The exact speculative
(``coupling``) sampler is not offered as a SAMPLER node: diffspec does not implement it yet.
"""

from .forecast import ComfyForecast
from .nodes import (
    NODE_CLASS_MAPPINGS,
    NODE_DISPLAY_NAME_MAPPINGS,
    ForecastStats,
    SpecaForecast,
    TaylorForecast,
)
from .patching import BlockPatch, apply_forecast, find_block_lists, forecast_of

__all__ = [
    "NODE_CLASS_MAPPINGS",
    "NODE_DISPLAY_NAME_MAPPINGS",
    "BlockPatch",
    "ComfyForecast",
    "ForecastStats",
    "SpecaForecast",
    "TaylorForecast",
    "apply_forecast",
    "find_block_lists",
    "forecast_of",
]
