"""Qwen-Image (``QwenImageTransformer2DModel``, called as ``QwenImagePipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def prompt_states(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-Image prompt states and their mask, zero-padded as the Qwen-Image pipelines pad them."""
    text = rand(batch, spec.text_tokens, spec.config["joint_attention_dim"])
    mask = text_mask(batch, spec.text_tokens, device)  # the pipeline drops the mask only when nothing is padded
    return text * mask[..., None].to(dtype), mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, hw * hw, cfg["in_channels"])  # packed 2x2 patches of the latent (patch_size=2)
    text, mask = prompt_states(spec, batch, rand, device, dtype)
    img_shapes = [[(1, hw, hw)]] * batch  # (frames, packed h, packed w) per sample: the rotary table

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # no guidance: Qwen-Image is not guidance-distilled (guidance_embeds=False)
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(dtype), guidance=None,
                     encoder_hidden_states_mask=mask, encoder_hidden_states=text, img_shapes=img_shapes,
                     return_dict=False)[0]

    return latents, call


FAMILIES = {"qwenimage": Family(cls="QwenImageTransformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # in_channels = 4 latent channels x 2x2 patch = patch_size**2 * out_channels (the output is packed too)
    "tiny-qwenimage": TransformerSpec(
        "tiny-qwenimage", "qwenimage",
        dict(patch_size=2, in_channels=16, out_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2,
             joint_attention_dim=24, axes_dims_rope=(4, 6, 6)),
        4, 6,
    ),
}
