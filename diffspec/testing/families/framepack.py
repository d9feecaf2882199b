"""FramePack (``HunyuanVideoFramepackTransformer3DModel``, called as ``HunyuanVideoFramepackPipeline`` calls it: the
first section of a two-section inverted anti-drifting image-to-video run)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

HISTORY_SIZES = (1, 2, 16)  # inverted anti-drifting: 1x, 2x and 4x history latent frames
LATENT_PADDING = 1  # latent_paddings = [1, 0] for two sections: the first one is padded by one window
IMAGE_TOKENS = 5  # SigLIP last hidden state of the input image (729 tokens at real size)
GUIDANCE_SCALE = 6.0  # the pipeline's default, embedded as guidance_scale * 1000


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, window = spec.config, spec.latent_hw, spec.frames  # frames: latent_window_size
    c = cfg["in_channels"]
    latents = rand(batch, c, window, hw, hw)  # (B, C, F, H, W)
    # Llama hidden states (template prefix cropped) padded to max_sequence_length, and their mask; CLIP pooled. With
    # batch_size == 1 the model trims the text stream to the prompt (its profile: batch_coupled)
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])
    mask = text_mask(batch, spec.text_tokens, device)
    pooled = rand(batch, cfg["pooled_projection_dim"])
    image_embeds = rand(batch, IMAGE_TOKENS, cfg["image_proj_dim"])
    guidance = torch.full((batch,), GUIDANCE_SCALE * 1000.0, device=device, dtype=dtype)
    # frame indices (one dimension, shared by the batch): [prefix, padding, window, 1x, 2x, 4x history]
    sizes = [1, LATENT_PADDING * window, window, *HISTORY_SIZES]
    prefix, _, indices, history_1x, history_2x, history_4x = torch.arange(sum(sizes), device=device).split(sizes)
    indices_clean = torch.cat([prefix, history_1x])
    # first section: the history is zeros; the clean latents are [the image's latents, the (zero) 1x history]
    image_latents = rand(batch, c, 1, hw, hw)
    zeros = torch.zeros(batch, c, sum(HISTORY_SIZES), hw, hw, device=device, dtype=dtype)
    latents_1x, latents_2x, latents_4x = zeros.split(list(HISTORY_SIZES), dim=2)
    latents_clean = torch.cat([image_latents, latents_1x], dim=2)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text,
                     encoder_attention_mask=mask, pooled_projections=pooled, image_embeds=image_embeds,
                     indices_latents=indices, guidance=guidance, latents_clean=latents_clean,
                     indices_latents_clean=indices_clean, latents_history_2x=latents_2x,
                     indices_latents_history_2x=history_2x, latents_history_4x=latents_4x,
                     indices_latents_history_4x=history_4x, return_dict=False)[0]

    return latents, call


FAMILIES = {"framepack": Family(cls="HunyuanVideoFramepackTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # FramePackI2V_HY layout: SigLIP image projection, history patch embedders (1x, 2x, 4x), guidance embedding;
    # rope axes (t, h, w) = (4, 6, 6) for head dim 16; a 3-frame latent window
    "tiny-framepack": TransformerSpec(
        "tiny-framepack", "framepack",
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
             num_single_layers=2, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
             text_embed_dim=24, pooled_projection_dim=16, rope_axes_dim=(4, 6, 6), image_condition_type=None,
             has_image_proj=True, image_proj_dim=16, has_clean_x_embedder=True),
        4, 6, 3,
    ),
}
