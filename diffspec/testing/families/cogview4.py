"""CogView4 (``CogView4Transformer2DModel``, ``CogView4Pipeline``): a tiny random-weight config and its call."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

VAE_SCALE = 8  # CogView4Pipeline: pixel size = latent size * vae_scale_factor


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)
    # GLM embeddings of a prompt left-padded with pad tokens to a multiple of 16; no attention mask is passed
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])
    # SDXL-like micro-conditioning: original and target size (pixels, default both = the image size), crop (0, 0)
    px = hw * VAE_SCALE
    size = torch.tensor([[px, px]] * batch, device=device, dtype=dtype)
    crop = torch.zeros(batch, 2, device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, encoder_hidden_states=text, timestep=t.expand(x.shape[0]), original_size=size,
                     target_size=size, crop_coords=crop, return_dict=False)[0]

    return latents, call


FAMILIES = {"cogview4": Family(cls="CogView4Transformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # text tokens: a multiple of 16, as the pipeline pads the GLM prompt
    "tiny-cogview4": TransformerSpec(
        "tiny-cogview4", "cogview4",
        dict(patch_size=2, in_channels=4, out_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2,
             text_embed_dim=24, time_embed_dim=32, condition_dim=16, pos_embed_max_size=16, sample_size=8),
        8, 16,
    ),
}
