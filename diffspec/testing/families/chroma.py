"""Chroma (``ChromaTransformer2DModel``, called as ``ChromaPipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    latents = rand(batch, hw * hw, cfg["in_channels"])  # packed 2x2 patches, as FluxPipeline
    text = rand(batch, tokens, cfg["joint_attention_dim"])
    # 2-D position ids (no batch dimension): image tokens (0, h, w), text tokens all zero
    img_ids = torch.zeros(hw, hw, 3)
    img_ids[..., 1] += torch.arange(hw)[:, None]
    img_ids[..., 2] += torch.arange(hw)[None, :]
    img_ids = img_ids.reshape(-1, 3).to(device=device, dtype=dtype)
    txt_ids = torch.zeros(tokens, 3, device=device, dtype=dtype)
    # ChromaPipeline keeps the prompt and its FIRST padding token (a prompt two tokens short here, so one is
    # masked), in the text encoder's dtype, then appends True for every image token: the concatenation
    # is a float 0/1 mask over text + image tokens, which the blocks square to (B, 1, S, S)
    prompt = text_mask(batch, tokens, device)
    prompt[:, -2] = 0
    keep = torch.arange(tokens, device=device)[None] <= prompt.sum(1, keepdim=True)
    mask = torch.cat([keep.to(dtype), torch.ones(batch, hw * hw, dtype=torch.bool, device=device)], dim=1)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text,
                     txt_ids=txt_ids, img_ids=img_ids, attention_mask=mask, return_dict=False)[0]

    return latents, call


FAMILIES = {"chroma": Family(cls="ChromaTransformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # approximator_num_channels / 4 sinusoid channels each for t, guidance (0) and the modulation index
    "tiny-chroma": TransformerSpec(
        "tiny-chroma", "chroma",
        dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(4, 6, 6), approximator_num_channels=16,
             approximator_hidden_dim=32, approximator_layers=2),
        4, 6,
    ),
}
