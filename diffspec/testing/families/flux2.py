"""FLUX.2 (``Flux2Transformer2DModel``, called as ``Flux2Pipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    # Flux2Pipeline: (B, 4C, H/2, W/2) noise (2x2 patches in the channels), packed to (B, H*W, 4C) tokens
    latents = rand(batch, cfg["in_channels"], hw, hw).flatten(2).transpose(1, 2).contiguous()
    text = rand(batch, spec.text_tokens, cfg["joint_attention_dim"])  # padded Mistral states, no mask passed
    # 4-axis (t, h, w, l) position ids with a batch dimension: image tokens (0, h, w, 0), text tokens (0, 0, 0, l)
    grid = torch.cartesian_prod(torch.arange(1), torch.arange(hw), torch.arange(hw), torch.arange(1))
    img_ids = grid.unsqueeze(0).expand(batch, -1, -1).to(device)
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(spec.text_tokens))
    txt_ids = txt_ids.unsqueeze(0).expand(batch, -1, -1).to(device)
    # the pipeline passes the raw guidance scale (default 4.0) in fp32; the model multiplies it by 1000
    guidance = torch.full((batch,), 4.0, device=device) if cfg.get("guidance_embeds", True) else None

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(dtype), guidance=guidance,
                     encoder_hidden_states=text, txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]

    return latents, call


FAMILIES = {"flux2": Family(cls="Flux2Transformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # head dim 16 = the four rope axes (t, h, w, l); in_channels = 4 latent channels x 2x2 patch
    "tiny-flux2": TransformerSpec(
        "tiny-flux2", "flux2",
        dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=32,
             axes_dims_rope=(4, 4, 4, 4), guidance_embeds=True),
        4, 6,
    ),
}
