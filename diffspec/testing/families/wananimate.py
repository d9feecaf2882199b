"""Wan-Animate (``WanAnimateTransformer3DModel``, called as ``WanAnimatePipeline`` calls it: animate mode, the first
inference segment)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

PROMPT_TOKENS = 6  # the prompt's length: umT5 embeddings past it are zeros (padded to 512, which the processor assumes)
IMAGE_TOKENS = 5  # CLIP penultimate hidden states of the character image (257 tokens at real size)
VAE_TEMPORAL = 4  # the Wan VAE's temporal factor: get_i2v_mask packs the pixel-frame mask into 4 channels


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames  # frames: latent frames of the segment
    c = cfg["latent_channels"]
    # prepare_latents: the segment's latent frames plus one for the reference image, first
    latents = rand(batch, c, frames + 1, hw, hw)
    text = rand(batch, spec.text_tokens, cfg["text_dim"])
    text[:, PROMPT_TOKENS:] = 0
    image = rand(1, IMAGE_TOKENS, cfg["image_dim"]).repeat(batch, 1, 1)
    # reference latents, concatenated in frames: the character image's (mask of ones) then the previous segment's
    # conditioning video (the first segment: VAE latents of a zero video, mask of zeros)
    ones, zeros = torch.ones(batch, VAE_TEMPORAL, 1, hw, hw), torch.zeros(batch, VAE_TEMPORAL, frames, hw, hw)
    reference_image = torch.cat([ones.to(device, dtype), rand(1, c, 1, hw, hw).repeat(batch, 1, 1, 1, 1)], dim=1)
    prev_segment = torch.cat([zeros.to(device, dtype), rand(1, c, frames, hw, hw).repeat(batch, 1, 1, 1, 1)], dim=1)
    reference = torch.cat([reference_image, prev_segment], dim=2)
    pose = rand(1, c, frames, hw, hw).repeat(batch, 1, 1, 1, 1)  # VAE latents of the pose video segment
    # the face video segment in pixels, (B, 3, pixel frames, size, size) in [-1, 1], expanded over the batch
    pixel_frames = (frames - 1) * VAE_TEMPORAL + 1
    size = cfg["motion_encoder_size"]
    face = rand(1, 3, pixel_frames, size, size).tanh().expand(batch, -1, -1, -1, -1)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=torch.cat([x, reference], dim=1), timestep=t.expand(x.shape[0]),
                     encoder_hidden_states=text, encoder_hidden_states_image=image, pose_hidden_states=pose,
                     face_pixel_values=face, return_dict=False)[0]

    return latents, call


FAMILIES = {"wananimate": Family(cls="WanAnimateTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # Wan-Animate-14B layout: in_channels = 2 * latent_channels + 4; image embedder and added K/V projections; a face
    # adapter after every inject_face_latents_blocks-th block (here blocks 0 and 2 of 4: as at real size, none after
    # the last); an 8-pixel face image (motion encoder: one res block to 4x4, then a 4x4 conv), 2 face-encoder heads
    "tiny-wananimate": TransformerSpec(
        "tiny-wananimate", "wananimate",
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=12, latent_channels=4,
             out_channels=4, text_dim=24, freq_dim=32, ffn_dim=64, num_layers=4, image_dim=16, added_kv_proj_dim=32,
             rope_max_seq_len=32, motion_encoder_channel_sizes={"4": 8, "8": 8}, motion_encoder_size=8,
             motion_style_dim=16, motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16,
             face_encoder_num_heads=2, inject_face_latents_blocks=2, motion_encoder_batch_size=8),
        4, 512, 2,
    ),
}
