"""``draft`` / ``text-draft`` behind :class:`~diffspec.api.SpeculativePipeline` for transformers models.

Example:
    >>> spec = SpeculativePipeline.from_pipe((model, processor), method="draft", draft=drafter)  # doctest: +SKIP
    >>> out = spec(text=["<image> what is it?"], images=[img], max_new_tokens=32)  # doctest: +SKIP
    >>> out.text, out.sequences.shape, spec.stats.target_calls  # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ..api import SpeculativePipeline
from ..config import MethodConfig
from ..multimodal.config import DraftConfig
from ..multimodal.loop import speculative_generate
from ..multimodal.self_config import SelfDraftConfig
from ..multimodal.seq2seq import check_speech_options, is_seq2seq, record_encoder_inputs
from ..multimodal.strategies import strategy_for
from ..stats import SpecStats

SUPPORTED = ("transformers generative models (GenerationMixin, DynamicCache): causal LMs such as Llama/Qwen2, "
             "LLaVA, LLaVA-NeXT, LLaVA-NeXT-Video, Qwen2-VL / Qwen2.5-VL (image and video), "
             "Whisper (speech seq2seq)")


@dataclass
class MultimodalOutput:
    """Result of a call: ``sequences`` (prompt + generated, as ``generate``), ``new_tokens`` (generated
    part, padded after EOS), ``text`` (decoded new tokens, None without a processor) and ``spec_stats``."""

    sequences: torch.Tensor
    new_tokens: torch.Tensor
    text: list[str] | None
    spec_stats: SpecStats | None = None


def split_target(target: Any) -> tuple[Any, Any]:
    if isinstance(target, (tuple, list)) and len(target) == 2:
        return target[0], target[1]
    return target, None


def check_generative(model: Any, role: str, method: str) -> None:
    can = getattr(model, "can_generate", None)
    if not callable(can) or not can():
        raise ValueError(f"method {method!r}: the {role} {type(model).__name__} is not supported; supported: "
                         f"{SUPPORTED}. Other models need an adapter exposing generate()/forward with a KV cache.")


class MultimodalPipeline(SpeculativePipeline):
    """A transformers model (``model`` or ``(model, processor)``) decoded with a drafter, exact.

    Built by ``SpeculativePipeline.from_pipe(target, method="draft" | "text-draft" | "compressed-draft",
    draft=drafter)`` or ``from_pipe(target, method="self-draft")`` (no drafter: the target drafts for itself).
    ``draft=`` is the drafter *model* object (a transformers model with the target's vocabulary:
    a smaller VLM, or a text-only LM), not a config field: ``from_pipe`` hands it to :meth:`wrap`,
    while method settings (``num_draft_tokens``, ``schedule``, ...) stay in the config.

    Call with the processor's inputs (``text=``, ``images=``, ``videos=``, or ``audio=`` with
    ``sampling_rate=`` for Whisper; needs the processor) or with ready tensors (``input_ids=``,
    ``attention_mask=``, ``pixel_values=``, ``input_features=``, ...), plus any
    ``generate`` option (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ...) and
    ``generator=`` (the RNG of every draw). Returns a :class:`MultimodalOutput`. ``spec.stats``:
    ``target_calls`` (prefill + one per round), ``draft_calls`` (drafter forwards incl. prefill),
    ``accepted``/``proposed``, ``extra["accepted_per_round"]`` (mean over active rows),
    ``extra["tokens_per_target_call"]``. :meth:`disable` makes calls use plain ``generate``.

    Example:
        >>> spec = SpeculativePipeline.from_pipe(llm, method="draft", draft=small, num_draft_tokens=4)  # doctest: +SKIP
        >>> spec(input_ids=ids, attention_mask=mask, max_new_tokens=16).sequences  # doctest: +SKIP
    """

    family = "multimodal"

    def __init__(self, pipe: Any, config: DraftConfig, drafter: Any = None, processor: Any = None) -> None:
        super().__init__(pipe, config)
        self.drafter = drafter
        self.processor = processor
        self.speculative = True
        self.enable()

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig, draft: Any = None) -> MultimodalPipeline:
        if not isinstance(config, DraftConfig):
            raise ValueError(f"{type(config).__name__} is not a multimodal draft config (DraftConfig, TextDraftConfig, "
                             "CompressedDraftConfig, SelfDraftConfig)")
        model, processor = split_target(target)
        check_generative(model, "target", config.method)
        if isinstance(config, SelfDraftConfig):
            if draft is not None:
                raise ValueError("method 'self-draft' drafts with the target itself: do not pass draft=")
            return cls(model, config, None, processor)
        if draft is None:
            raise ValueError(f"method {config.method!r} needs draft=<drafter model>: a smaller transformers model "
                             "with the target's tokenizer (a VLM or a text-only LM)")
        check_generative(draft, "drafter", config.method)
        return cls(model, config, draft, processor)

    def enable(self) -> None:
        """Decode speculatively (the default)."""
        self.enabled = True
        self.speculative = True

    def disable(self) -> None:
        """Decode with plain ``generate`` (same inputs, same output type)."""
        self.speculative = False

    def _inputs(self, text: Any, images: Any, videos: Any, kwargs: dict[str, Any], audio: Any = None,
                sampling_rate: int | None = None) -> dict[str, Any]:
        tensors = {k: kwargs.pop(k) for k in list(kwargs) if isinstance(kwargs[k], torch.Tensor)}
        if audio is not None:
            if self.processor is None:
                raise ValueError("audio= needs a processor: wrap (model, processor) or pass input_features=")
            rate = {} if sampling_rate is None else {"sampling_rate": sampling_rate}
            return dict(self.processor(audio=audio, return_tensors="pt", **rate)).copy() | tensors
        if text is None:
            if "input_ids" not in tensors and not is_seq2seq(self.pipe):
                raise ValueError("pass text= (with a processor) or input_ids= (ready tensors)")
            return tensors
        if self.processor is None:
            raise ValueError("text= needs a processor: wrap (model, processor) or pass input_ids=")
        given = {k: v for k, v in (("images", images), ("videos", videos)) if v is not None}
        return dict(self.processor(text=text, return_tensors="pt", padding=True, **given)).copy() | tensors

    def _run(self, text: Any = None, images: Any = None, videos: Any = None, audio: Any = None,
             sampling_rate: int | None = None, generator: torch.Generator | None = None,
             **kwargs: Any) -> MultimodalOutput:
        inputs = self._inputs(text, images, videos, kwargs, audio, sampling_rate)
        inputs = {k: v.to(self.pipe.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        seq2seq = is_seq2seq(self.pipe)
        if self.speculative:
            cfg = self.config
            if seq2seq:
                check_speech_options(self.pipe, kwargs)
            with record_encoder_inputs(self.pipe) if seq2seq else nullcontext(inputs) as drafter_inputs:
                seqs = self.pipe.generate(
                    **inputs, **kwargs, custom_generate=speculative_generate, drafter=self.drafter,
                    num_draft_tokens=cfg.num_draft_tokens, draft_schedule=cfg.schedule,
                    max_draft_tokens=cfg.max_draft_tokens, text_only_draft=cfg.text_only,
                    drafter_inputs=drafter_inputs, generator=generator, spec_stats=self.stats,
                    draft_strategy=strategy_for(cfg))
        else:
            seqs = self.pipe.generate(**inputs, **kwargs)
        # Whisper's generate returns the new tokens only (its decoder prompt is stripped)
        new = seqs if seq2seq else seqs[:, inputs["input_ids"].shape[1]:]
        decode = getattr(self.processor, "batch_decode", None)
        text_out = decode(new, skip_special_tokens=True) if decode is not None else None
        return MultimodalOutput(seqs, new, text_out)

    def plain(self, *args: Any, **kwargs: Any) -> MultimodalOutput:
        """One call with plain ``generate`` (the reference the speculative call reproduces)."""
        was = self.speculative
        self.speculative = False
        try:
            return self(*args, **kwargs)
        finally:
            self.speculative = was
