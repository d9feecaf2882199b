"""diffspec: speculative and forecast acceleration for diffusers and transformers generation.

The public names below import their modules (and torch) on first use, so ``import diffspec`` is light.

Example:
    >>> from diffspec import SpeculativePipeline  # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pretrained("tiny-dit", method="taylor")  # doctest: +SKIP
    >>> images = spec(class_labels=[0, 1, 2], num_inference_steps=50).images  # doctest: +SKIP
"""

from typing import TYPE_CHECKING

from .lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "MethodInfo": ".api", "SpeculativePipeline": ".api", "methods": ".api",
    "MCSJDConfig": ".ar_image.config", "SJDConfig": ".ar_image.config",
    "AutospecConfig": ".config", "CouplingConfig": ".config", "ForecastConfig": ".config",
    "MethodConfig": ".config", "SpecaConfig": ".config",
    "disable_progress_bar": ".progress", "enable_progress_bar": ".progress",
    "SpecStats": ".stats",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .api import MethodInfo, SpeculativePipeline, methods
    from .ar_image.config import MCSJDConfig, SJDConfig
    from .config import AutospecConfig, CouplingConfig, ForecastConfig, MethodConfig, SpecaConfig
    from .progress import disable_progress_bar, enable_progress_bar
    from .stats import SpecStats

__all__ = [
    "AutospecConfig",
    "CouplingConfig",
    "ForecastConfig",
    "MCSJDConfig",
    "SJDConfig",
    "SpecaConfig",
    "MethodConfig",
    "MethodInfo",
    "SpecStats",
    "SpeculativePipeline",
    "disable_progress_bar",
    "enable_progress_bar",
    "methods",
    "__version__",
]
