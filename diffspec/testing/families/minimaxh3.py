"""MiniMax-H3 (``MiniMaxH3Transformer3DModel``, as the ``minimax-h3`` modular pipeline's ``t2va`` task calls it).

One packed sequence ``[text | target audio | target video]`` runs through one block list (the text refiner's blocks,
nested in ``token_refiner``, read no timestep and run every step). The layout and the per-row timestep plan come from
the modular pipeline's own builders; its batch axis only replicates that layout (the pipeline runs batch 1).
``call`` advances only the video rows: the audio rows stay the same random noise at every step (the pipeline
denoises them too, on their own schedule), as in ``ltx2``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

AUDIO_LATENTS = 5  # audio latents per channel (40 per second at real size)
AUDIO_CHANNELS = 2  # stereo, packed channel-major: AUDIO_LATENTS * AUDIO_CHANNELS audio rows
VIDEO_SHIFT, AUDIO_SHIFT = 12.0, 3.0  # the two MiniMaxH3Scheduler shifts (video, audio) of one base sigma grid
VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2


def _shift(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    return shift * sigma / (1 + (shift - 1) * sigma)


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
    )

    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    patch = tuple(cfg["patch_size"])
    # text-to-video-and-audio: no keyframe anchors; every text row tagged as text (no vision block in the prompt)
    tags = torch.full((spec.text_tokens,), TEXT_TAG, dtype=torch.long)
    position_ids, token_tags, video_indices, audio_indices, text_indices, n_cond_video, n_cond_audio = (
        MiniMaxH3PrepareLayoutStep.build_packed_sequence(tags, frames, hw, hw, AUDIO_LATENTS, patch, AUDIO_CHANNELS,
                                                         AUDIO_TAG, VIDEO_TAG))
    layout = dict(token_tags=token_tags.to(device), position_ids=position_ids.to(device, torch.float32),
                  video_indices=video_indices.to(device), audio_indices=audio_indices.to(device),
                  text_indices=text_indices.to(device))
    # patchified video rows (frame-major) and channel-major audio rows, with a replicated batch axis
    latents = rand(batch, video_indices.numel(), cfg["in_channels"] * patch[0] * patch[1] * patch[2])
    audio = rand(batch, audio_indices.numel(), cfg["audio_in_channels"])
    text = rand(batch, spec.text_tokens, cfg["text_dim"])  # Qwen3-VL hidden states of the unpadded prompt

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # t / 1000 is the video sigma; the audio sigma is the same base grid point under the audio shift; the model
        # takes 1 - sigma (0 = noise, it grows over sampling), as the distinct timesteps of the layout and each row's
        # index into them
        sigma = float(t) / 1000
        base = sigma / (VIDEO_SHIFT - (VIDEO_SHIFT - 1) * sigma)
        audio_sigma = float(_shift(torch.tensor(base), AUDIO_SHIFT))
        timestep, timestep_indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_indices, audio_indices, n_cond_video, n_cond_audio, spec.text_tokens, 1.0 - sigma, 1.0 - audio_sigma,
            max(1.0 - sigma, 0.999), 1.0)
        video, _ = model(hidden_states=x, audio_hidden_states=audio, encoder_hidden_states=text,
                         timestep=timestep.to(x.device), timestep_indices=timestep_indices.to(x.device),
                         attention_kwargs=None, return_dict=False, **layout)
        return -video  # a data-ward velocity (x0 = x_t + sigma * v): negated for the usual flow-matching update

    return latents, call


FAMILIES = {"minimaxh3": Family(cls="MiniMaxH3Transformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # 2 heads of 16 (rope_freq_dim 2: 2 * 3 * 2 = 12 of the 16 head channels rotated), one text refiner block
    "tiny-minimaxh3": TransformerSpec(
        "tiny-minimaxh3", "minimaxh3",
        dict(num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=3, num_refiner_layers=1,
             ffn_dim=64, in_channels=4, audio_in_channels=8, patch_size=(1, 2, 2), text_dim=24, freq_dim=32,
             time_embed_hidden_dim=32, time_embed_dim=32, rope_freq_dim=2),
        4, 6, 2,
    ),
}
