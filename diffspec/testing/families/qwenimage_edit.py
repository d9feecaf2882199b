"""Qwen-Image-Edit (``QwenImageTransformer2DModel`` with ``zero_cond_t=True``, called as
``QwenImageEditPlusPipeline`` calls it for Qwen-Image-Edit-2511).

The condition image's packed latents follow the noisy latents along the sequence; ``img_shapes`` lists
both per row (the model builds its per-token ``modulate_index`` from it: the noisy tokens are modulated
by the real timestep, the condition tokens by timestep 0, so each block's ``temb`` has 2B rows), and
only the noisy part of the prediction is kept.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec
from .qwenimage import prompt_states


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, hw * hw, cfg["in_channels"])  # packed 2x2 patches of the noisy latent
    ch, cw = hw // 2, hw  # a condition image of another shape (the pipeline keeps its aspect ratio)
    cond = rand(batch, ch * cw, cfg["in_channels"])  # its packed VAE latents, fixed across steps
    text, mask = prompt_states(spec, batch, rand, device, dtype)
    img_shapes = [[(1, hw, hw), (1, ch, cw)]] * batch  # noisy image, then the condition image, per row

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = model(hidden_states=torch.cat([x, cond], dim=1), timestep=t.expand(x.shape[0]).to(dtype),
                    guidance=None, encoder_hidden_states_mask=mask, encoder_hidden_states=text,
                    img_shapes=img_shapes, return_dict=False)[0]
        return out[:, : x.shape[1]]  # the prediction for the noisy latents only

    return latents, call


FAMILIES = {"qwenimage-edit": Family(cls="QwenImageTransformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    "tiny-qwenimage-edit": TransformerSpec(
        "tiny-qwenimage-edit", "qwenimage-edit",
        dict(patch_size=2, in_channels=16, out_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2,
             joint_attention_dim=24, axes_dims_rope=(4, 6, 6), zero_cond_t=True),
        4, 6,
    ),
}
