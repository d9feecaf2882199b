"""Lumina-Image 2.0 (``Lumina2Transformer2DModel``, ``Lumina2Pipeline``): a tiny random-weight config and its call."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)
    text = rand(batch, spec.text_tokens, cfg["cap_feat_dim"])  # Gemma hidden states, padded prompt
    mask = text_mask(batch, spec.text_tokens, device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # Lumina2Pipeline: t = 0 is noise and 1 the image, so the model gets 1 - t / 1000 (it grows over sampling)
        timestep = 1 - t.expand(x.shape[0]) / 1000
        out = model(hidden_states=x, timestep=timestep, encoder_hidden_states=text, encoder_attention_mask=mask,
                    return_dict=False)[0]
        return -out  # the pipeline negates the prediction before the scheduler step

    return latents, call


FAMILIES = {"lumina2": Family(cls="Lumina2Transformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # grouped-query attention (2 heads, 1 KV head) as the real model (24 / 8); rope axes sum to the head dim;
    # num_layers > num_refiner_layers, so the joint `layers` are the block list found (no _repeated_blocks)
    "tiny-lumina2": TransformerSpec(
        "tiny-lumina2", "lumina2",
        dict(sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=3, num_refiner_layers=2,
             num_attention_heads=2, num_kv_heads=1, multiple_of=16, axes_dim_rope=(4, 6, 6), axes_lens=(32, 16, 16),
             cap_feat_dim=24),
        8, 6,
    ),
}
