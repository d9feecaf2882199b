"""Mochi 1 (``MochiTransformer3DModel``, called as ``MochiPipeline`` calls it: reversed timesteps)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    latents = rand(batch, cfg["in_channels"], frames, hw, hw)  # (B, C, F, H, W), unpatchified
    # T5 states padded to max_sequence_length with the tokenizer's boolean mask (the attention drops padded tokens)
    text, mask = rand(batch, spec.text_tokens, cfg["text_embed_dim"]), text_mask(batch, spec.text_tokens, device).bool()

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # the scheduler's invert_sigmas: the model sees 1000 * (1 - sigma), growing over sampling, and predicts
        # data - noise; negated here into the velocity of the other flow1000 families
        timestep = (1000 - t.expand(x.shape[0])).to(dtype)
        return -model(hidden_states=x, encoder_hidden_states=text, timestep=timestep, encoder_attention_mask=mask,
                      return_dict=False)[0]

    return latents, call


def _init(model: nn.Module) -> None:
    """Random rotary frequencies: the class initialises them to zero (RoPE would be the identity)."""
    nn.init.normal_(model.pos_frequencies, std=0.1)


FAMILIES = {"mochi": Family(cls="MochiTransformer3DModel", make_call=_call, timesteps="flow1000", init=_init)}

SPECS = {
    # the last block is context_pre_only (it returns the text stream unchanged); the caption pooler has 8 heads,
    # so text_embed_dim is a multiple of 8; pooled_projection_dim is the width of the text stream in the blocks
    "tiny-mochi": TransformerSpec(
        "tiny-mochi", "mochi",
        dict(patch_size=2, num_attention_heads=2, attention_head_dim=16, num_layers=3, pooled_projection_dim=16,
             in_channels=4, text_embed_dim=24, time_embed_dim=32, max_sequence_length=6),
        4, 6, 2,
    ),
}
