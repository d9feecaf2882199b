"""AuraFlow (``AuraFlowTransformer2DModel``, called as ``AuraFlowPipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)  # (B, C, H, W): the model patchifies them itself
    # as encode_prompt: Pile-T5 states padded to max_length and zeroed past the prompt; no mask reaches the model
    text = rand(batch, spec.text_tokens, cfg["joint_attention_dim"])
    text = text * text_mask(batch, spec.text_tokens, device)[..., None].to(dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # the pipeline passes t / 1000 (1 = noise, 0 = image) in the latents' dtype; the model scales it by 1000
        return model(x, encoder_hidden_states=text, timestep=t.expand(x.shape[0]).to(dtype), return_dict=False)[0]

    return latents, call


FAMILIES = {"auraflow": Family(cls="AuraFlowTransformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # caption_projection_dim = the inner dim (the 8 register tokens are joined to the projected caption);
    # pos_embed_max_size = the 4x4 patch grid of the 8x8 latent (a square table, centred crops of it)
    "tiny-auraflow": TransformerSpec(
        "tiny-auraflow", "auraflow",
        dict(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=2, num_single_dit_layers=3,
             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24, caption_projection_dim=32,
             out_channels=4, pos_embed_max_size=16),
        8, 6,
    ),
}
