"""HunyuanImage 2.1 (``HunyuanImageTransformer2DModel``, as called by ``HunyuanImagePipeline``)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

GLYPH_TOKENS = 4
"""ByT5 (glyph text) tokens of the tiny call; the pipeline pads them to 128."""


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)  # (B, C, H, W); patch size 1 (the VAE compresses 32x)
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])  # Qwen2.5-VL, padded to max length
    mask = text_mask(batch, spec.text_tokens, device)
    # ByT5 stream of a prompt with quoted text to render (a prompt without any gets zeros and an all-zero
    # mask); the transformer puts the valid tokens of both streams first, then the padding
    glyph = rand(batch, GLYPH_TOKENS, cfg["text_embed_2_dim"])
    glyph_mask = text_mask(batch, GLYPH_TOKENS, device)
    # the base model: no distilled guidance embedding, no meanflow timestep_r (the distilled one has both)
    guidance = torch.full((batch,), 3250.0, device=device, dtype=dtype) if cfg.get("guidance_embeds") else None

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text,
                     encoder_attention_mask=mask, encoder_hidden_states_2=glyph, encoder_attention_mask_2=glyph_mask,
                     guidance=guidance, return_dict=False)[0]

    return latents, call


FAMILIES = {"hunyuanimage": Family(cls="HunyuanImageTransformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # rope_axes_dim sums to attention_head_dim; the ByT5 projection's 2048 hidden width is fixed by the class
    "tiny-hunyuanimage": TransformerSpec(
        "tiny-hunyuanimage", "hunyuanimage",
        dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, num_layers=2,
             num_single_layers=2, num_refiner_layers=1, patch_size=(1, 1), text_embed_dim=24, text_embed_2_dim=16,
             rope_axes_dim=(8, 8), guidance_embeds=False),
        4, 6,
    ),
}
