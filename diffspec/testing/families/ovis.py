"""Ovis-Image (``OvisImageTransformer2DModel``, called as ``OvisImagePipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    # _pack_latents: (B, C, H, W) noise packed in 2x2 patches to (B, (H/2)*(W/2), 4C) tokens of iid noise
    latents = rand(batch, hw * hw, cfg["in_channels"])
    # Ovis states padded to max_sequence_length and zeroed on the padding (prompt_embeds * attention_mask); no mask
    # reaches the transformer
    text = rand(batch, tokens, cfg["joint_attention_dim"]) * text_mask(batch, tokens, device)[..., None].to(dtype)
    # position ids without a batch dimension: text (0, i, i), image (0, h, w)
    txt_ids = torch.zeros(tokens, 3)
    txt_ids[:, 1] = txt_ids[:, 2] = torch.arange(tokens)
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(hw), torch.arange(hw)).float()
    txt_ids, img_ids = txt_ids.to(device, dtype), img_ids.to(device, dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # timestep / 1000 = sigma (the model multiplies by 1000); CFG calls the model once per branch
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(x.dtype), encoder_hidden_states=text,
                     txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]

    return latents, call


FAMILIES = {"ovis": Family(cls="OvisImageTransformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # Flux-like: dual-stream then single-stream blocks; sum(axes_dims_rope) = head dim; in_channels = 4 x 2x2 patch
    "tiny-ovis": TransformerSpec(
        "tiny-ovis", "ovis",
        dict(patch_size=1, in_channels=16, out_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(4, 6, 6)),
        4, 6,
    ),
}
