"""Bria 3.x (``BriaTransformer2DModel``, called as ``BriaPipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    latents = rand(batch, hw * hw, cfg["in_channels"])  # packed 2x2 patches, as FluxPipeline
    # _get_t5_prompt_embeds encodes each prompt unpadded and appends zeros up to max_sequence_length; no mask
    text = rand(batch, tokens, cfg["joint_attention_dim"]) * text_mask(batch, tokens, device)[..., None].to(dtype)
    # position ids without a batch dimension (the pipeline drops it): image tokens (0, h, w), text tokens all zero
    img_ids = torch.zeros(hw, hw, 3)
    img_ids[..., 1] += torch.arange(hw)[:, None]
    img_ids[..., 2] += torch.arange(hw)[None, :]
    img_ids = img_ids.reshape(-1, 3).to(device=device, dtype=dtype)
    txt_ids = torch.zeros(tokens, 3, device=device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # the scheduler's timestep (1000 * sigma) as is; no pooled projection, no guidance embedding
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text, txt_ids=txt_ids,
                     img_ids=img_ids, return_dict=False)[0]

    return latents, call


FAMILIES = {"bria": Family(cls="BriaTransformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # in_channels = 4 latent channels x 2x2 patch (the output is packed too); rope axes sum to the head dim
    "tiny-bria": TransformerSpec(
        "tiny-bria", "bria",
        dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=3, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=[4, 6, 6]),
        4, 6,
    ),
}
