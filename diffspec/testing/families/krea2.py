"""Krea 2 (``Krea2Transformer2DModel``, called as ``Krea2Pipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

SUFFIX_TOKENS = 2  # template suffix tokens after the padding: Krea 2 pads in the middle, [prompt | PAD | suffix]


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    # noise packed in 2x2 patches (_pack_latents): (B, (H/2)*(W/2), 4C) tokens of iid noise
    latents = rand(batch, hw * hw, cfg["in_channels"])
    # a stack of tapped Qwen3-VL hidden states per token (B, T, layers, D), padded to max_sequence_length before
    # the template suffix; the boolean mask is always passed (the padded states are the encoder's, not zeros)
    text = rand(batch, tokens, cfg["num_text_layers"], cfg["text_hidden_dim"])
    mask = torch.ones(batch, tokens, dtype=torch.bool, device=device)
    mask[:, tokens - SUFFIX_TOKENS - 1] = False
    # prepare_position_ids: (T + h*w, 3) without a batch dimension; text at the origin, image rows (0, h, w)
    grid = torch.cartesian_prod(torch.arange(1), torch.arange(hw), torch.arange(hw)).float()
    position_ids = torch.cat([torch.zeros(tokens, 3), grid]).to(device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # timestep = t / num_train_timesteps = sigma (1 = noise); CFG calls the model once per branch
        return model(hidden_states=x, encoder_hidden_states=text, timestep=t.expand(x.shape[0]).to(x.dtype),
                     position_ids=position_ids, encoder_attention_mask=mask, return_dict=False)[0]

    return latents, call


FAMILIES = {"krea2": Family(cls="Krea2Transformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # one joint [text, image] block list (the text fusion blocks run every step, before it: timestep-independent);
    # sum(axes_dims_rope) = head dim; grouped-query attention (2 heads, 1 KV head); in_channels = 4 x 2x2 patch
    "tiny-krea2": TransformerSpec(
        "tiny-krea2", "krea2",
        dict(in_channels=16, num_layers=3, attention_head_dim=16, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=64, timestep_embed_dim=32, text_hidden_dim=24, num_text_layers=3,
             text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=48,
             num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6)),
        4, 6,
    ),
}
