"""Motif-Video (``MotifVideoTransformer3DModel``, as ``MotifVideoPipeline`` calls it: text-to-video).

Dual-stream blocks, single-stream blocks, then (released config) a DDT decoder: the last ``num_decoder_layers`` single
blocks restart from the patch embeddings with the encoder's output as their second stream; they are forecast as a list
of their own (its profile's ``split_list``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    c = cfg["out_channels"]  # the VAE's z_dim
    latents = rand(batch, c, frames, hw, hw)  # (B, C, F, H, W)
    # T5Gemma2 states padded to max_sequence_length (not zeroed) with the tokenizer's mask as bool
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])
    mask = text_mask(batch, spec.text_tokens, device).bool()
    # T2V: [latents | zero condition latents | zero mask] channels (in_channels = 2 * z_dim + 1)
    cond = torch.zeros(batch, c + 1, frames, hw, hw, device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # FlowMatchEulerDiscreteScheduler timesteps (1000 * sigma), one per row; no image_embeds in T2V
        return model(hidden_states=torch.cat([x, cond], dim=1), timestep=t.expand(x.shape[0]),
                     encoder_hidden_states=text, encoder_attention_mask=mask, attention_kwargs=None,
                     return_dict=False)[0]

    return latents, call


FAMILIES = {"motifvideo": Family(cls="MotifVideoTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # the released layout at tiny size (12 dual + 16 single + 8 decoder there): 2 dual, 4 single of which the last 2
    # are the DDT decoder, text cross-attention in both stacks; rope axes sum to the head dim (16)
    "tiny-motifvideo": TransformerSpec(
        "tiny-motifvideo", "motifvideo",
        dict(in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
             num_single_layers=4, num_decoder_layers=2, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
             text_embed_dim=24, rope_axes_dim=(4, 6, 6), enable_text_cross_attention_dual=True,
             enable_text_cross_attention_single=True),
        4, 6, 2,
    ),
}
