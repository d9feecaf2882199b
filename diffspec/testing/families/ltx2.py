"""LTX-2 (``LTX2VideoTransformer3DModel``, called as ``LTX2Pipeline`` calls it: text-to-audio-video).

Every block transforms two streams, video (``hidden_states``) and audio (``audio_hidden_states``), and returns both;
the transformer returns (video, audio) predictions. ``call`` advances only the video latents: the audio latents
stay the same random noise at every step (the pipeline denoises them too, with a copy of the scheduler).
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

AUDIO_CHANNELS = 4  # audio VAE latent channels (8 at real size)
AUDIO_MEL_BINS = 4  # latent mel bins (16 at real size); packed as (B, L, C * M): audio_in_channels = C * M
AUDIO_FRAMES = 5  # latent audio length (the pipeline: round(duration * sampling_rate / hop / 4))
FPS = 24.0  # LTX2Pipeline's default frame_rate, passed as fps and used for the video coordinates


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    latents = rand(batch, frames * hw * hw, cfg["in_channels"])  # packed (B, F*H*W, C), patch size 1
    # prepare_audio_latents: (B, C, L, M) noise packed to (B, L, C * M); fixed across steps here (see the docstring)
    audio = rand(batch, AUDIO_CHANNELS, AUDIO_FRAMES, AUDIO_MEL_BINS).transpose(1, 2).flatten(2, 3)
    # the text connectors' outputs: video and audio text embeddings and the binary (B, S) mask; the video embeddings
    # are zeroed where the mask is 0, the audio ones are not (connectors without learnable registers)
    mask = text_mask(batch, spec.text_tokens, device)
    text = rand(batch, spec.text_tokens, cfg["caption_channels"]) * mask[..., None].to(dtype)
    audio_text = rand(batch, spec.text_tokens, cfg["caption_channels"])

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        # the pipeline computes the RoPE coordinates once, before the loop, from the transformer's own helpers
        video_coords = model.rope.prepare_video_coords(rows, frames, hw, hw, x.device, fps=FPS)
        audio_coords = model.audio_rope.prepare_audio_coords(rows, AUDIO_FRAMES, x.device)
        timestep = t.expand(rows)  # (B,): one value per row, 1000 * sigma; also passed as sigma
        return model(hidden_states=x, audio_hidden_states=audio, encoder_hidden_states=text,
                     audio_encoder_hidden_states=audio_text, timestep=timestep, sigma=timestep,
                     encoder_attention_mask=mask, audio_encoder_attention_mask=mask, num_frames=frames, height=hw,
                     width=hw, fps=FPS, audio_num_frames=AUDIO_FRAMES, video_coords=video_coords,
                     audio_coords=audio_coords, isolate_modalities=False, spatio_temporal_guidance_blocks=None,
                     perturbation_mask=None, use_cross_timestep=True, return_dict=False)[0]

    return latents, call


FAMILIES = {"ltx2": Family(cls="LTX2VideoTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # video: 2 heads x 16 = 32; audio: 2 heads x 8 = 16 (audio_cross_attention_dim = the audio width, as released);
    # audio_in_channels = AUDIO_CHANNELS * AUDIO_MEL_BINS
    "tiny-ltx2": TransformerSpec(
        "tiny-ltx2", "ltx2",
        dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
             attention_head_dim=16, cross_attention_dim=32, audio_in_channels=AUDIO_CHANNELS * AUDIO_MEL_BINS,
             audio_out_channels=AUDIO_CHANNELS * AUDIO_MEL_BINS, audio_num_attention_heads=2,
             audio_attention_head_dim=8, audio_cross_attention_dim=16, num_layers=2, caption_channels=24),
        4, 6, 2,
    ),
}
