"""Speculative decoding for transformers generative models: text LMs and VLMs (image, video).

The shared draft/verify loop (:func:`~diffspec.multimodal.loop.speculative_generate`) plugs into
``model.generate(custom_generate=...)``; :class:`~diffspec.multimodal.pipeline.MultimodalPipeline`
is what ``SpeculativePipeline.from_pipe((model, processor), method="draft", draft=drafter)`` builds.

Example:
    >>> from diffspec import SpeculativePipeline  # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pipe((vlm, processor), method="text-draft", draft=small_lm)  # doctest: +SKIP
    >>> out = spec(text=["<image> Describe it."], images=[img], max_new_tokens=32)  # doctest: +SKIP
    >>> out.text, spec.stats.extra["accepted_per_round"]  # doctest: +SKIP
"""

from typing import Any

from .action_config import RelaxedActionConfig
from .action_map import ActionTokenMap
from .config import DraftConfig, TextDraftConfig


def __getattr__(name: str) -> Any:  # the loop imports transformers: load it on first use only
    if name == "speculative_generate":
        from .loop import speculative_generate

        return speculative_generate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ActionTokenMap", "DraftConfig", "RelaxedActionConfig", "TextDraftConfig", "speculative_generate"]
