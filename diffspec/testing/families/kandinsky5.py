"""Kandinsky 5.0 video (``Kandinsky5Transformer3DModel``, as called by ``Kandinsky5T2VPipeline``)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    c = cfg["in_visual_dim"]
    latents = rand(batch, frames, hw, hw, c)  # channels last: (B, F, H, W, C)
    # Qwen2.5-VL tokens padded to the longest prompt; no attention mask reaches the transformer
    text = rand(batch, spec.text_tokens, cfg["in_text_dim"])
    pooled = rand(batch, cfg["in_text_dim2"])  # CLIP pooled
    pt, ph, pw = cfg["patch_size"]
    visual_rope_pos = [torch.arange(frames // pt, device=device), torch.arange(hw // ph, device=device),
                       torch.arange(hw // pw, device=device)]
    text_rope_pos = torch.arange(spec.text_tokens, device=device)
    scale_factor = (1, 3.16, 3.16)  # Kandinsky5T2VPipeline._get_scale_factor outside 480p
    # visual_cond models (the T2V checkpoints) take [noise, zero condition, zero mask] channels; the scheduler
    # only updates the noise channels, so the condition stays zero
    cond = torch.zeros(batch, frames, hw, hw, c + 1, device=device, dtype=dtype) if cfg.get("visual_cond") else None

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        hidden = x if cond is None else torch.cat([x, cond], dim=-1)
        return model(hidden_states=hidden, encoder_hidden_states=text, pooled_projections=pooled,
                     timestep=t.expand(x.shape[0]).to(dtype), visual_rope_pos=visual_rope_pos,
                     text_rope_pos=text_rope_pos, scale_factor=scale_factor, sparse_params=None, return_dict=False)  # a tensor

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the adaLN modulations, which the class initialises to zero (every block would be the
    identity)."""
    for module in model.modules():
        if type(module).__name__ == "Kandinsky5Modulation":
            module.out_layer.reset_parameters()


FAMILIES = {"kandinsky5": Family(cls="Kandinsky5Transformer3DModel", make_call=_call, timesteps="flow1000",
                                 init=_init)}

SPECS = {
    # head_dim = sum(axes_dims); "regular" attention (the "nabla" sparse attention needs flex attention and
    # 8x8-patch grids); text blocks run first, their output is the decoder blocks' cross-attention context
    "tiny-kandinsky5": TransformerSpec(
        "tiny-kandinsky5", "kandinsky5",
        dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=24, in_text_dim2=16, time_dim=32, patch_size=(1, 2, 2),
             model_dim=32, ff_dim=64, num_text_blocks=2, num_visual_blocks=3, axes_dims=(4, 6, 6), visual_cond=True,
             attention_type="regular"),
        4, 6, 2,
    ),
}
