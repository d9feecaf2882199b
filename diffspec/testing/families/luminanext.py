"""Lumina-Next (``LuminaNextDiT2DModel``, as ``LuminaText2ImgPipeline`` calls it: text-to-image)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

VAE_SCALE = 8  # the pipeline's vae_scale_factor: default_image_size = sample_size * VAE_SCALE


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)
    text = rand(batch, spec.text_tokens, cfg["cross_attention_dim"])  # Gemma's second-to-last layer, padded
    mask = text_mask(batch, spec.text_tokens, device)  # the tokenizer's mask, passed as encoder_mask
    # proportional attention (the default): softmax scaled by log(tokens) / log(the default size's tokens)
    kwargs = {"base_sequence_length": (cfg["sample_size"] * VAE_SCALE // 16) ** 2}
    # the image is at the default size: scaling_factor 1, so the time-aware rotary table (linear below the
    # scaling_watershed, NTK above) is the same at every step; 384 x 384 positions as the pipeline's, no batch dimension
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    rotary = get_2d_rotary_pos_embed_lumina(head_dim, 384, 384, linear_factor=1.0, ntk_factor=1.0).to(device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        timestep = 1 - t.expand(x.shape[0]) / 1000  # Lumina's t = 0 is noise, 1 the image: it grows over sampling
        out = model(hidden_states=x, timestep=timestep, encoder_hidden_states=text, encoder_mask=mask,
                    image_rotary_emb=rotary, cross_attention_kwargs=kwargs, return_dict=False)[0]
        return -out.chunk(2, dim=1)[0]  # learnt-sigma channels dropped; negated before the scheduler step

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the blocks' cross-attention gates (tanh-gated), which the class initialises to zero (the
    prompt would not reach the image)."""
    for name, param in model.named_parameters():
        if name.endswith(".gate"):
            nn.init.normal_(param)


FAMILIES = {"luminanext": Family(cls="LuminaNextDiT2DModel", make_call=_call, timesteps="flow1000", init=_init)}

SPECS = {
    # grouped-query attention (2 heads, 1 KV head); head dim 16 (the 2-D rope needs a multiple of 4); learn_sigma
    # (the default) doubles the output channels; sample_size 8 = the latent size, so no resolution scaling
    "tiny-luminanext": TransformerSpec(
        "tiny-luminanext", "luminanext",
        dict(sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=3, num_attention_heads=2,
             num_kv_heads=1, multiple_of=16, cross_attention_dim=24),
        8, 6,
    ),
}
