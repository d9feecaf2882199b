"""Helios (``HeliosTransformer3DModel``, as ``HeliosPipeline`` calls it for one chunk of its autoregressive video).

The pipeline denoises the video chunk by chunk; each chunk's call also takes the latest generated latents as short,
mid and long history (patchified at 1x, 2x and 4x and prepended to the chunk's tokens, with a zero timestep). Here
one chunk past the first is denoised: its history window is full of (random) generated latents, fixed over its steps.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

HISTORY_SIZES = (16, 2, 1)  # HeliosPipeline's history_sizes (long, mid, 1x latent frames), keep_first_frame=True


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames  # frames = num_latent_frames_per_chunk
    c = cfg["in_channels"]
    latents = rand(batch, c, frames, hw, hw)  # (B, C, F, H, W), one chunk
    # UMT5 embeddings zero-padded past the prompt's length; no attention mask reaches the transformer
    text = rand(batch, spec.text_tokens, cfg["text_dim"]) * text_mask(batch, spec.text_tokens, device)[..., None]
    # history: the last sum(HISTORY_SIZES) generated latent frames split into long / mid / 1x; the short history is
    # the first frame of the video (the prefix) then the 1x frames
    long_, mid, one_x = rand(batch, c, sum(HISTORY_SIZES), hw, hw).split(HISTORY_SIZES, dim=2)
    short = torch.cat([rand(batch, c, 1, hw, hw), one_x], dim=2)
    # frame indices (prefix, long, mid, 1x, chunk), each with a batch dimension of 1
    prefix_i, long_i, mid_i, one_x_i, chunk_i = torch.arange(1 + sum(HISTORY_SIZES) + frames, device=device).split(
        [1, *HISTORY_SIZES, frames])
    short_i = torch.cat([prefix_i, one_x_i])

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # HeliosScheduler timesteps: 1000 * sigma, one per row
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text,
                     indices_hidden_states=chunk_i[None], indices_latents_history_short=short_i[None],
                     indices_latents_history_mid=mid_i[None], indices_latents_history_long=long_i[None],
                     latents_history_short=short, latents_history_mid=mid, latents_history_long=long_,
                     attention_kwargs=None, return_dict=False)[0]

    return latents, call


FAMILIES = {"helios": Family(cls="HeliosTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # rope_dim sums to the head dim (16); the released defaults: guidance_cross_attn (only the chunk's tokens
    # cross-attend), zero_history_timestep, multi-term memory patches. The blocks' per-token temb and rotary tables
    # cover history and chunk tokens; the history tokens are forecast with the rest of the stream.
    "tiny-helios": TransformerSpec(
        "tiny-helios", "helios",
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
             text_dim=24, freq_dim=32, ffn_dim=64, num_layers=3, rope_dim=(4, 6, 6)),
        4, 6, 2,
    ),
}
