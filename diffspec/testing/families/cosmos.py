"""Cosmos-Predict2.5 (``CosmosTransformer3DModel``, called as ``Cosmos2_5_PredictBasePipeline`` calls it: image-to-world,
one conditioning latent frame)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

COND_FRAMES = 1  # latent frames given by the input image (num_frames_in=1 -> one latent frame)
COND_TIMESTEP = 0.0001  # the pipeline's conditional_frame_timestep


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    channels = cfg["in_channels"] - 1  # the pipeline's num_channels_latents: the condition mask is the last channel
    latents = rand(batch, channels, frames, hw, hw)  # (B, C, F, H, W)
    # Qwen2.5-VL hidden states of every layer, each normalised, concatenated (crossattn_proj maps them); padded to
    # max_sequence_length, no attention mask passed
    text = rand(batch, spec.text_tokens, cfg["crossattn_proj_in_channels"])
    cond_latents = rand(batch, channels, frames, hw, hw)  # VAE latents of the (padded) input video
    # create_condition_mask: the first COND_FRAMES latent frames are given
    cond_indicator = torch.zeros(batch, 1, frames, 1, 1, device=device)  # fp32, as the timestep built from it
    cond_indicator[:, :, :COND_FRAMES] = 1.0
    cond_mask = cond_indicator.expand(-1, -1, -1, hw, hw).to(dtype)
    gt_velocity = (latents - cond_latents) * cond_mask  # from the initial noise, as the pipeline

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # per-frame timestep (B, 1, F, 1, 1): sigma on generated frames, conditional_frame_timestep on given ones
        timestep = cond_indicator * COND_TIMESTEP + (1 - cond_indicator) * t.float()
        inputs = cond_mask * cond_latents + (1 - cond_mask) * x
        pred = model(hidden_states=inputs, condition_mask=cond_mask, timestep=timestep,
                     encoder_hidden_states=text, return_dict=False)[0]
        # the given frames' velocity is replaced by the ground-truth one (the flow from the conditioning latents)
        return gt_velocity + pred * (1 - cond_mask)

    return latents, call


FAMILIES = {"cosmos": Family(cls="CosmosTransformer3DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # Predict2.5 layout: in_channels = latent + condition mask; no learnable positional embedding; cross-attention
    # projection of the concatenated text-encoder layers; rope_scale (1, 3, 3); head dim 16 -> rope axes
    # (t, h, w) = (8, 4, 4). concat_padding_mask=False (released: True, whose mask resize needs torchvision): the
    # pipeline's padding mask is all zeros, so its patch-embed channel (no bias) adds nothing; the model is the same
    "tiny-cosmos": TransformerSpec(
        "tiny-cosmos", "cosmos",
        dict(in_channels=5, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=3, mlp_ratio=2.0,
             text_embed_dim=32, adaln_lora_dim=8, max_size=(8, 16, 16), patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0),
             concat_padding_mask=False, extra_pos_embed_type=None, use_crossattn_projection=True,
             crossattn_proj_in_channels=24, encoder_hidden_states_channels=32),
        4, 6, 2,
    ),
}
