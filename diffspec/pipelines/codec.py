"""``relaxed-codec`` behind :class:`~diffspec.api.SpeculativePipeline`: MusicGen decoders with a drafter.

Example:
    >>> spec = SpeculativePipeline.from_pipe(decoder, method="relaxed-codec", draft=small_decoder, beta=0.5)  # doctest: +SKIP
    >>> out = spec(batch_size=2, max_new_tokens=64)  # doctest: +SKIP
    >>> out.audio_codes.shape, spec.stats.extra["relaxed_tokens"]  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import MethodConfig
from ..multimodal.codec import codec_generate
from ..multimodal.codec_config import RelaxedCodecConfig
from ..stats import SpecStats
from .multimodal import MultimodalPipeline, split_target

CODEC_SUPPORTED = ("MusicgenForCausalLM (a MusicGen decoder: unconditional, an audio-code prompt, or given "
                   "encoder_hidden_states; for MusicgenForConditionalGeneration wrap model.decoder and pass "
                   "encoder_hidden_states=model.enc_to_dec_proj(text_encoder_states))")


@dataclass
class CodecOutput:
    """``audio_codes`` (B, K, frames) as ``MusicgenForCausalLM.generate`` returns them, and ``spec_stats``."""

    audio_codes: torch.Tensor
    spec_stats: SpecStats | None = None


def token_disagreement(codes: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """Fraction of codes that differ from the reference (plain greedy on the same inputs), overall and per codebook.

    Example:
        >>> a = torch.zeros(1, 2, 4, dtype=torch.long)
        >>> token_disagreement(a, a.clone().index_fill_(1, torch.tensor([1]), 3))
        {'overall': 0.5, 'per_codebook': [0.0, 1.0]}
    """
    if codes.shape != reference.shape:
        raise ValueError(f"codes {tuple(codes.shape)} and reference {tuple(reference.shape)} differ in shape")
    diff = (codes != reference).float()
    return {"overall": float(diff.mean()), "per_codebook": diff.mean((0, 2)).tolist()}


def _is_codec_lm(model: Any) -> bool:
    return hasattr(model, "build_delay_pattern_mask") and isinstance(getattr(model, "num_codebooks", None), int)


class CodecPipeline(MultimodalPipeline):
    """A MusicGen decoder decoded with a smaller drafter and relaxed acceptance (method ``relaxed-codec``).

    Call with ``input_ids`` ((B * K, T0) prompt codes, first column the start token) or
    ``batch_size`` (unconditional), ``max_new_tokens`` and optionally ``encoder_hidden_states``.
    Greedy only. ``spec.stats``: ``target_calls``, ``draft_calls``, ``accepted``/``proposed``
    (drafted steps per row), ``extra["relaxed_tokens"]`` (accepted tokens that differ from the
    target's greedy token), ``extra["frames_per_target_call"]``. ``beta=1`` equals ``spec.plain``.

    Example:
        >>> spec = SpeculativePipeline.from_pipe(decoder, method="relaxed-codec", draft=small)  # doctest: +SKIP
        >>> token_disagreement(spec(max_new_tokens=32).audio_codes, spec.plain(max_new_tokens=32).audio_codes)  # doctest: +SKIP
    """

    @classmethod
    def wrap(cls, target: Any, config: MethodConfig, draft: Any = None) -> CodecPipeline:
        if not isinstance(config, RelaxedCodecConfig):
            raise ValueError(f"{type(config).__name__} is not a RelaxedCodecConfig")
        model, processor = split_target(target)
        if not _is_codec_lm(model):
            raise ValueError(f"method 'relaxed-codec': the target {type(model).__name__} is not supported; "
                             f"supported: {CODEC_SUPPORTED}")
        if draft is None or not _is_codec_lm(draft) or draft.num_codebooks != model.num_codebooks:
            raise ValueError("method 'relaxed-codec' needs draft=<a smaller MusicgenForCausalLM with "
                             f"num_codebooks={model.num_codebooks} and the target's codebook vocabulary>")
        return cls(model, config, draft, processor)

    def _prompt(self, input_ids: torch.Tensor | None, batch_size: int) -> torch.Tensor:
        if input_ids is not None:
            return input_ids.to(self.pipe.device)
        gc = self.pipe.generation_config
        start = gc.decoder_start_token_id if gc.decoder_start_token_id is not None else gc.pad_token_id
        return torch.full((batch_size * self.pipe.num_codebooks, 1), int(start), device=self.pipe.device)

    def _run(self, input_ids: torch.Tensor | None = None, *, max_new_tokens: int, batch_size: int = 1,
             encoder_hidden_states: torch.Tensor | None = None, do_sample: bool = False,
             **kwargs: Any) -> CodecOutput:
        if do_sample or kwargs:
            extra = sorted(kwargs) + (["do_sample=True"] if do_sample else [])
            raise ValueError(f"relaxed-codec does not support {', '.join(extra)}: it decodes greedily with "
                             "input_ids/batch_size, max_new_tokens and encoder_hidden_states only")
        ids = self._prompt(input_ids, batch_size)
        if self.speculative:
            cfg = self.config
            codes = codec_generate(self.pipe, self.drafter, ids, max_new_tokens=max_new_tokens,
                                   num_draft_tokens=cfg.num_draft_tokens, beta=cfg.beta,
                                   exact_codebooks=cfg.exact_codebooks,
                                   encoder_hidden_states=encoder_hidden_states, spec_stats=self.stats)
        else:
            extra = {} if encoder_hidden_states is None else {"encoder_hidden_states": encoder_hidden_states}
            codes = self.pipe.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False,
                                       num_return_sequences=1, **extra)
        return CodecOutput(codes)
