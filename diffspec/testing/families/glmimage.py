"""GLM-Image (``GlmImageTransformer2DModel``, called as ``GlmImagePipeline`` calls it in text-to-image mode)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

VAE_SCALE = 8  # GlmImagePipeline: pixel size = latent size * vae_scale_factor


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)  # (B, C, H, W), patchified inside the model
    # ByT5 glyph embeddings, left-padded with zeros to the longest prompt; no attention mask is passed
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])
    text[1:, 0] = 0.0  # rows after the first: one glyph token shorter
    # the AR model's prior tokens on a grid of half the patch grid, upsampled 2x (nearest): one per image token
    grid = hw // cfg["patch_size"] // 2
    ids = (rand(batch, grid, grid).abs() * 1e4).long() % cfg["prior_vq_quantizer_codebook_size"]  # seeded ids
    prior_ids = ids.repeat_interleave(2, -2).repeat_interleave(2, -1).flatten(1)  # (B, image tokens), int64
    prior_drop = torch.zeros_like(prior_ids, dtype=torch.bool)  # the conditional branch keeps every prior token
    # target size (pixels) and crop's top-left corner (0, 0), in the prompt embeddings' dtype
    size = torch.tensor([[hw * VAE_SCALE] * 2] * batch, device=device, dtype=dtype)
    crop = torch.zeros(batch, 2, device=device, dtype=dtype)
    # the pipeline always passes a KV cache; only image-to-image writes (and then reads) the condition images' keys
    kv_caches = GlmImageKVCache(num_layers=cfg["num_layers"])

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        timestep = t.expand(x.shape[0]) - 1  # the pipeline passes the scheduler's timestep minus 1
        return model(hidden_states=x, encoder_hidden_states=text, prior_token_id=prior_ids, prior_token_drop=prior_drop,
                     timestep=timestep, target_size=size, crop_coords=crop, return_dict=False,
                     kv_caches=kv_caches)[0]

    return latents, call


FAMILIES = {"glmimage": Family(cls="GlmImageTransformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # rope: head dim 16 split between the h and w axes; pooled conditioning = 4 * condition_dim
    "tiny-glmimage": TransformerSpec(
        "tiny-glmimage", "glmimage",
        dict(patch_size=2, in_channels=4, out_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2,
             text_embed_dim=24, time_embed_dim=32, condition_dim=16, prior_vq_quantizer_codebook_size=64),
        8, 6,
    ),
}
