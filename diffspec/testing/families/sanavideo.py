"""Sana-Video (``SanaVideoTransformer3DModel``, as called by ``SanaVideoPipeline``)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], spec.frames, hw, hw)  # (B, C, F, H, W)
    text = rand(batch, spec.text_tokens, cfg["caption_channels"])  # Gemma-2, padded to max_sequence_length
    mask = text_mask(batch, spec.text_tokens, device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # flow-matching DPM-Solver timesteps (1000 * sigma), unscaled; no guidance embedding (guidance_embeds=False)
        return model(x, encoder_hidden_states=text, encoder_attention_mask=mask, timestep=t.expand(x.shape[0]),
                     return_dict=False)[0]

    return latents, call


FAMILIES = {"sanavideo": Family(cls="SanaVideoTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # linear self-attention with Wan's 3-D RoPE (rope_max_seq_len bounds frames / rows / columns per axis);
    # the feed-forward is a GLUMB conv with a temporal conv over the frames
    "tiny-sanavideo": TransformerSpec(
        "tiny-sanavideo", "sanavideo",
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=3,
             num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32, caption_channels=24,
             sample_size=4, patch_size=(1, 2, 2), rope_max_seq_len=32),
        4, 6, 2,
    ),
}
