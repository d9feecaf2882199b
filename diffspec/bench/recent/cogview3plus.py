"""CogView3-Plus (``CogView3PlusTransformer2DModel``, called as ``CogView3PlusPipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..model_spec import Call, Family, Rand, TransformerSpec

VAE_SCALE = 8  # the pipeline's micro-conditioning sizes are in pixels


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)  # (B, C, H, W), patchified by the model
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])  # T5 states padded to max_sequence_length, no mask
    # SDXL-style micro-conditioning in the prompt dtype: original = target = (height, width) px, crop (0, 0)
    size = torch.full((batch, 2), float(hw * VAE_SCALE), device=device, dtype=dtype)
    crop = torch.zeros(batch, 2, device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # CogVideoXDDIMScheduler: discrete 0..999 timesteps, v-prediction
        return model(hidden_states=x, encoder_hidden_states=text, timestep=t.expand(x.shape[0]), original_size=size,
                     target_size=size, crop_coords=crop, return_dict=False)[0]

    return latents, call


FAMILIES = {"cogview3plus": Family(cls="CogView3PlusTransformer2DModel", make_call=_call, timesteps="ddpm")}

SPECS = {
    # pos_embed_max_size bounds the latent grid (a sincos table of pos_embed_max_size**2 positions);
    # condition_dim sizes each micro-conditioning scalar's embedding (pooled projection = 6 * condition_dim)
    "tiny-cogview3plus": TransformerSpec(
        "tiny-cogview3plus", "cogview3plus",
        dict(patch_size=2, in_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2, out_channels=4,
             text_embed_dim=24, time_embed_dim=32, condition_dim=8, pos_embed_max_size=8, sample_size=8),
        8, 6,
    ),
}
