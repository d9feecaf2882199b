"""Wan VACE (``WanVACETransformer3DModel``, called as ``WanVACEPipeline`` calls it: a control video and its scale)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

MASK_PATCH = 2  # the VAE's spatial factor (8 at real size): the pixel mask is packed into MASK_PATCH**2 channels


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    channels = cfg["in_channels"]
    latents = rand(batch, channels, frames, hw, hw)  # (B, C, F, H, W)
    # as WanPipeline: no attention mask; the T5 embeddings past the prompt's length are zeroed instead
    text = rand(batch, spec.text_tokens, cfg["text_dim"]) * text_mask(batch, spec.text_tokens, device)[..., None]
    # control latents: VAE latents of the video outside the mask (inactive) and inside it (reactive), then the
    # binary pixel mask packed per latent pixel (prepare_masks); here the right half of every frame is regenerated
    mask = torch.zeros(batch, MASK_PATCH**2, frames, hw, hw, device=device, dtype=dtype)
    mask[..., hw // 2:] = 1.0
    inactive, reactive = rand(batch, channels, frames, hw, hw), rand(batch, channels, frames, hw, hw)
    control = torch.cat([inactive, reactive, mask], dim=1)
    # conditioning_scale=1.0 becomes one scale per VACE layer, without a batch dimension
    scale = torch.ones(len(cfg["vace_layers"]), device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text,
                     control_hidden_states=control, control_hidden_states_scale=scale, return_dict=False)[0]

    return latents, call


FAMILIES = {"wanvace": Family(cls="WanVACETransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # vace_in_channels = 2 * in_channels + MASK_PATCH**2; as in the released configs the last layer takes no
    # VACE hint (every hint is added between two blocks)
    "tiny-wanvace": TransformerSpec(
        "tiny-wanvace", "wanvace",
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
             text_dim=24, freq_dim=32, ffn_dim=64, num_layers=3, rope_max_seq_len=32, vace_layers=[0, 1],
             vace_in_channels=12),
        4, 6, 2,
    ),
}
