"""ChronoEdit (``ChronoEditTransformer3DModel``, called as ``ChronoEditPipeline`` calls it: an image edit as a
two-latent-frame video, without temporal reasoning)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec

TEXT_TOKENS = 512  # the attention processor splits image from text tokens assuming 512 (padded T5) text tokens
PROMPT_TOKENS = 6  # the prompt's length: T5 embeddings past it are zeros
IMAGE_TOKENS = 5  # CLIP penultimate hidden states (257 tokens at real size)
VAE_TEMPORAL = 4  # the Wan VAE's temporal factor: the first-frame mask is packed into 4 channels


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    channels = cfg["out_channels"]  # the VAE's z_dim
    latents = rand(batch, channels, frames, hw, hw)  # (B, C, F, H, W); num_frames=5 -> 2 latent frames
    # as WanPipeline: T5 embeddings padded to 512 tokens, zero past the prompt, no attention mask
    text = rand(batch, spec.text_tokens, cfg["text_dim"])
    text[:, PROMPT_TOKENS:] = 0
    image = rand(1, IMAGE_TOKENS, cfg["image_dim"]).repeat(batch, 1, 1)  # encode_image, repeated per prompt
    # prepare_latents: [first-frame mask packed per latent frame (VAE_TEMPORAL channels), VAE latents of the image
    # followed by zero frames]; the same condition for every row
    mask = torch.zeros(batch, VAE_TEMPORAL, frames, hw, hw, device=device, dtype=dtype)
    mask[:, :, 0] = 1.0
    condition = torch.cat([mask, rand(1, channels, frames, hw, hw).repeat(batch, 1, 1, 1, 1)], dim=1)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=torch.cat([x, condition], dim=1), timestep=t.expand(x.shape[0]),
                     encoder_hidden_states=text, encoder_hidden_states_image=image, return_dict=False)[0]

    return latents, call


FAMILIES = {"chronoedit": Family(cls="ChronoEditTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # ChronoEdit-14B layout (Wan 2.1 I2V): in_channels = latent + VAE_TEMPORAL mask + condition latent, an image
    # embedder and added K/V projections for the image tokens; with 2 latent frames the rope puts them at temporal
    # positions 0 and rope_temporal_skip_len - 1
    "tiny-chronoedit": TransformerSpec(
        "tiny-chronoedit", "chronoedit",
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=12, out_channels=4,
             text_dim=24, freq_dim=32, ffn_dim=64, num_layers=3, image_dim=16, added_kv_proj_dim=32,
             rope_max_seq_len=32, rope_temporal_skip_len=8),
        4, TEXT_TOKENS, 2,
    ),
}
