"""diffspec: speculative and forecast acceleration for diffusers and transformers generation.

Example:
    >>> from diffspec import SpeculativePipeline  # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pretrained("tiny-dit", method="taylor")  # doctest: +SKIP
    >>> images = spec(class_labels=[0, 1, 2], num_inference_steps=50).images  # doctest: +SKIP
"""

from .api import MethodInfo, SpeculativePipeline, methods
from .ar_image.config import MCSJDConfig, SJDConfig
from .config import AutospecConfig, CouplingConfig, ForecastConfig, MethodConfig, SpecaConfig
from .progress import disable_progress_bar, enable_progress_bar
from .stats import SpecStats

__version__ = "0.1.0"

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
