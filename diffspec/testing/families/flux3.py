"""FLUX.3 (``Flux3Transformer2DModel``, called as the ``Flux3ModularPipeline`` denoise step calls it; diffusers has
no standard FLUX.3 pipeline)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

IMAGE_ROPE_SCALE = 0.5  # Flux3PrepareLatentsStep: image H/W position ids are scaled by this factor


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    # Flux3PrepareLatentsStep: (B, 4C, H/16, W/16) noise (2x2 patches in the channels), packed to (B, h*w, 4C) tokens
    latents = rand(batch, cfg["in_channels"], hw, hw).flatten(2).transpose(1, 2).contiguous()
    text = rand(batch, spec.text_tokens, cfg["joint_attention_dim"])  # stacked Qwen3-VL states, padded, no mask
    # fp32 (t, h, w, l) position ids without a batch dimension: image (0, h/2, w/2, 0), text (0, 0, 0, l)
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(hw), torch.arange(hw), torch.tensor([0])).float()
    img_ids[:, 1:3] *= IMAGE_ROPE_SCALE
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1),
                                   torch.arange(spec.text_tokens)).float()
    img_ids, txt_ids = img_ids.to(device), txt_ids.to(device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # Flux3LoopDenoiser: timestep = scheduler t / 1000 = sigma (1 = noise), one per row; text-to-image (no
        # reference tokens), not a flow map (no target_timestep); CFG calls the model once per branch
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(x.dtype), encoder_hidden_states=text,
                     img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]

    return latents, call


FAMILIES = {"flux3": Family(cls="Flux3Transformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # head dim 16 = the four rope axes (t, h, w, l); in_channels = 4 latent channels x 2x2 patch. Block lists (in
    # execution order): text mode blocks, image mode blocks, joint single blocks (its profile's block_lists)
    "tiny-flux3": TransformerSpec(
        "tiny-flux3", "flux3",
        dict(in_channels=16, cond_in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, timestep_channels=32, axes_dims_rope=(4, 4, 4, 4)),
        4, 6,
    ),
}
