"""Drafter input preparation: what a VLM drafter or a text-only drafter sees of the prompt.

The drafter's inputs are prepared by transformers itself: :func:`prepare_drafter` runs the
drafter's own ``generate`` up to the point where decoding would start (a capturing
``custom_generate``), so its cache, position ids (M-RoPE for a Qwen-VL drafter) and pixel inputs
are exactly what its plain generation would use; then it prefills the prompt.

Example:
    >>> state = prepare_drafter(drafter, target, input_ids, model_kwargs, text_only=True)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from .prune import PrunePrefill, compact_index, decoder_of
from .slots import SlotState, forward_params

GENERATION_INTERNAL = frozenset({
    "attention_mask", "position_ids", "past_key_values", "use_cache", "cache_position", "logits_to_keep",
    "output_attentions", "output_hidden_states", "return_dict",
})
"""Model kwargs that ``generate`` builds itself (never copied to the drafter)."""

MULTIMODAL_TOKEN_ATTRS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index",
                          "audio_token_id", "audio_token_index")
"""Config attributes naming placeholder ids that a text-only drafter must not see."""


def accepts_pixels(model: Any) -> bool:
    """Whether ``model.forward`` takes visual inputs (``pixel_values``)."""
    return "pixel_values" in forward_params(model)


def multimodal_token_ids(config: Any, attrs: tuple[str, ...] = MULTIMODAL_TOKEN_ATTRS) -> list[int]:
    """The placeholder token ids of a (VLM) config (the ``attrs`` it has), looked up on it and its ``text_config``."""
    ids: set[int] = set()
    for cfg in (config, getattr(config, "text_config", None)):
        for attr in attrs:
            value = getattr(cfg, attr, None) if cfg is not None else None
            if isinstance(value, int):
                ids.add(value)
    return sorted(ids)


def text_mask(target: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              model_kwargs: dict[str, Any]) -> torch.Tensor:
    """(B, T) 1 where a prompt token is real text: padding, visual placeholders and any position
    whose ``mm_token_type_ids`` is non-zero are 0."""
    mask = attention_mask.bool()
    mm = model_kwargs.get("mm_token_type_ids")
    if mm is not None:
        mask = mask & (mm == 0)
    special = multimodal_token_ids(target.config)
    if special:
        mask = mask & ~torch.isin(input_ids, torch.tensor(special, device=input_ids.device))
    return mask.long()


def _capture(model: Any, input_ids: torch.Tensor, logits_processor: Any, stopping_criteria: Any,
             generation_config: Any, **model_kwargs: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    return input_ids, model_kwargs


def prepare_drafter(drafter: Any, target: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any],
                    *, text_only: bool, drafter_inputs: dict[str, Any] | None = None,
                    keep: torch.Tensor | None = None) -> SlotState:
    """Prefill the drafter on the prompt and return its slot state.

    Args:
        drafter: a transformers generative model with the target's vocabulary.
        target: the target model (its config names the visual placeholder ids).
        input_ids: (B, T) prompt ids as the target received them (left padded).
        model_kwargs: the target's prepared model kwargs (attention mask, pixels, ...).
        text_only: feed the text tokens only (forced when the drafter takes no pixels or no
            ``drafter_inputs`` are given).
        drafter_inputs: the processor's outputs (pixels, grids, ``mm_token_type_ids``) for a VLM
            drafter. They must be passed apart: by the time ``custom_generate`` runs, transformers
            has replaced the target's pixels by its own encoder outputs (``mm_encoder_outputs``).
        keep: (B, T) bool, the prompt slots the drafter's decoder keeps (``compressed-draft``: pruned
            visual tokens, at their original positions; see :class:`~diffspec.multimodal.prune.PrunePrefill`).
    """
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask
    extra: dict[str, Any] = {}
    if text_only or not drafter_inputs or not accepts_pixels(drafter):
        mask = text_mask(target, input_ids, mask, model_kwargs)
        fill = drafter.generation_config.pad_token_id
        input_ids = input_ids.masked_fill(mask == 0, 0 if fill is None else int(fill))
    else:
        extra = {k: v for k, v in drafter_inputs.items()
                 if k not in GENERATION_INTERNAL and k != "input_ids" and v is not None}
    ids, kwargs = drafter.generate(input_ids=input_ids, attention_mask=mask, custom_generate=_capture,
                                   max_new_tokens=1, do_sample=False, **extra)
    inputs = drafter.prepare_inputs_for_generation(ids, is_first_iteration=True, **kwargs)
    inputs["logits_to_keep"] = 1
    if keep is None:
        out = drafter(**inputs)
        return SlotState.after_prefill(out.past_key_values, mask, kwargs.get("position_ids"))
    index, valid = compact_index(keep & mask.bool())
    with PrunePrefill(decoder_of(drafter), index, valid, width=ids.shape[1]) as prune:
        out = drafter(**inputs)
    return SlotState.after_prefill(out.past_key_values, valid.long(), prune.positions)
