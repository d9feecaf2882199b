"""Speculative decoding for transformers generative models: text LMs, VLMs (image, video), Whisper, MusicGen.

The shared draft/verify loop (:func:`~diffspec.multimodal.loop.speculative_generate`) plugs into
``model.generate(custom_generate=...)``; :class:`~diffspec.pipelines.multimodal.MultimodalPipeline`
is what ``SpeculativePipeline.from_pipe((model, processor), method="draft", draft=drafter)`` builds.

Example:
    >>> from diffspec import SpeculativePipeline  # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pipe((vlm, processor), method="text-draft", draft=small_lm)  # doctest: +SKIP
    >>> out = spec(text=["<image> Describe it."], images=[img], max_new_tokens=32)  # doctest: +SKIP
    >>> out.text, spec.stats.extra["accepted_per_round"]  # doctest: +SKIP
    >>> spec = SpeculativePipeline.from_pipe((video_lm, processor), method="self-draft", visual_top_k=256)  # doctest: +SKIP

Whisper runs through the same loop (encoder-decoder: :mod:`~diffspec.multimodal.seq2seq`);
MusicGen decoders through ``relaxed-codec`` (:mod:`~diffspec.multimodal.codec`).
"""

from typing import Any

from .action_config import RelaxedActionConfig
from .action_map import ActionTokenMap
from .codec_config import RelaxedCodecConfig
from .compressed_config import CompressedDraftConfig
from .config import DraftConfig, TextDraftConfig
from .self_config import SelfDraftConfig


def __getattr__(name: str) -> Any:  # the loops import transformers: load them on first use only
    if name == "speculative_generate":
        from .loop import speculative_generate

        return speculative_generate
    if name == "codec_generate":
        from .codec import codec_generate

        return codec_generate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ActionTokenMap", "CompressedDraftConfig", "DraftConfig", "RelaxedActionConfig", "RelaxedCodecConfig",
           "SelfDraftConfig", "TextDraftConfig", "codec_generate", "speculative_generate"]
