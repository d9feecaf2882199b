"""Encoder-decoder targets (Whisper ASR) in the shared draft/verify loop: drafter preparation.

The target's encoder runs once inside ``generate`` (``model_kwargs["encoder_outputs"]``); the
loop then feeds only its decoder, whose :class:`~transformers.EncoderDecoderCache` is rolled back
on the self-attention part (the cross-attention part, computed once from the encoder states,
is kept). The drafter is one of:

- an encoder-decoder model (a smaller Whisper, distil-whisper style) with **its own encoder**,
  run once per ``generate`` call on the features the target's encoder just saw (recorded by
  :func:`record_encoder_inputs`: Whisper's ``generate`` may call the decoding loop several times
  on shifted or fewer rows, so the processor's original features are not the right ones);
- an encoder-decoder model that **shares the target's encoder** module (``drafter.get_encoder()
  is target.get_encoder()``): the target's encoder outputs are reused, no second encoder pass;
- a decoder-only model with cross-attention (``WhisperForCausalLM``, as in transformers'
  Whisper assisted generation) reading the target's encoder states (same ``d_model``).

Example:
    >>> state = prepare_seq2seq_drafter(small_whisper, whisper, decoder_ids, model_kwargs,  # doctest: +SKIP
    ...                                 drafter_inputs={"input_features": feats})
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .slots import SlotState


@contextmanager
def record_encoder_inputs(target: Any) -> Iterator[dict[str, Any]]:
    """Record the input of every call of the target's encoder into the yielded dict (the last one wins).

    Pass the dict as ``drafter_inputs`` so a drafter with its own encoder sees the same segment.

    Example:
        >>> with record_encoder_inputs(whisper) as seen:  # doctest: +SKIP
        ...     ids = whisper.generate(feats, custom_generate=speculative_generate, drafter=small,
        ...                            drafter_inputs=seen)
    """
    seen: dict[str, Any] = {}
    name = getattr(target, "main_input_name", "input_features")

    def hook(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        value = kwargs.get(name, args[0] if args else None)
        if value is not None:
            seen[name] = value

    handle = target.get_encoder().register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def is_seq2seq(model: Any) -> bool:
    """Whether ``model`` is an encoder-decoder (its decoder is what the loop feeds)."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


def _encoder_states(outputs: Any) -> torch.Tensor:
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs.last_hidden_state


def drafter_encoder_outputs(drafter: Any, target: Any, model_kwargs: dict[str, Any],
                            drafter_inputs: dict[str, Any] | None) -> Any:
    """The encoder outputs the drafter's decoder cross-attends to (see the module docstring)."""
    enc = model_kwargs.get("encoder_outputs")
    if enc is None:
        raise ValueError("an encoder-decoder target needs encoder_outputs in its model kwargs (call it through "
                         "target.generate(..., custom_generate=speculative_generate))")
    if not is_seq2seq(drafter):
        return _encoder_states(enc)  # WhisperForCausalLM: the target's encoder states
    if drafter.get_encoder() is target.get_encoder():
        return enc
    name = getattr(drafter, "main_input_name", "input_features")
    features = (drafter_inputs or {}).get(name)
    batch = _encoder_states(enc).shape[0]
    if features is None or features.shape[0] != batch:
        raise ValueError(f"the drafter {type(drafter).__name__} has its own encoder: pass the target's encoder "
                         f"inputs as drafter_inputs (`with record_encoder_inputs(target) as seen: target.generate("
                         "..., drafter_inputs=seen)`; the pipeline does this), or use a drafter sharing the "
                         "target's encoder, or a decoder-only drafter (WhisperForCausalLM)")
    features = features.to(device=drafter.device, dtype=drafter.dtype)
    return drafter.get_encoder()(features)


def prepare_seq2seq_drafter(drafter: Any, target: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any],
                            drafter_inputs: dict[str, Any] | None = None) -> SlotState:
    """Prefill the drafter's decoder on the decoder prompt ``input_ids`` (B, T) and return its slot state.

    Args:
        drafter: an encoder-decoder or decoder-only model with the target's vocabulary ids.
        target: the encoder-decoder target.
        input_ids: (B, T) decoder prompt (Whisper: start, language, task, no-timestamps tokens).
        model_kwargs: the target's prepared kwargs (``encoder_outputs``, ``decoder_attention_mask``).
        drafter_inputs: the processor's outputs (``input_features``) for a drafter with its own encoder.
    """
    mask = model_kwargs.get("decoder_attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask.long()
    enc = drafter_encoder_outputs(drafter, target, model_kwargs, drafter_inputs)
    state = SlotState(cache=None, mask=mask[:, :0], next_pos=torch.zeros_like(input_ids[:, 0]),
                      seq2seq=is_seq2seq(drafter), static={"encoder_outputs": enc})
    state.forward(drafter, input_ids, mask, logits_to_keep=1)
    return state


SPEECH_UNSUPPORTED = ("return_token_timestamps", "return_segments", "return_dict_in_generate", "output_scores",
                      "output_attentions", "logprob_threshold", "compression_ratio_threshold",
                      "no_speech_threshold")
"""Whisper ``generate`` options that need per-step scores or attentions (not produced by the loop)."""


def check_speech_options(model: Any, kwargs: dict[str, Any]) -> None:
    """Raise a clear ``ValueError`` for Whisper options the speculative loop does not support.

    Supported (tested identical to plain ``generate``): transcribe / translate, language given or
    detected, with or without ``return_timestamps``, short- and long-form (``attention_mask`` over
    the features), ``prompt_ids``, ``condition_on_prev_tokens``, greedy or one sampling temperature.
    Not supported: options that read per-step scores or attentions (token timestamps, segments,
    temperature fallback thresholds, no-speech detection), beam search, a temperature schedule.
    """
    bad = [name for name in SPEECH_UNSUPPORTED if kwargs.get(name) not in (None, False)]
    if isinstance(kwargs.get("temperature"), (tuple, list)):
        bad.append("temperature=<schedule>")
    if int(kwargs.get("num_beams") or 1) > 1:
        bad.append("num_beams>1")
    if bad:
        raise ValueError(f"{type(model).__name__} speculative decoding does not support {', '.join(bad)}: the loop "
                         "produces token ids only (no per-step scores/attentions, no beam search). Supported: "
                         "transcribe/translate, language given or detected, return_timestamps, short- and "
                         "long-form audio, prompt_ids, condition_on_prev_tokens, greedy or one temperature; "
                         "call spec.plain(...) for the rest")
