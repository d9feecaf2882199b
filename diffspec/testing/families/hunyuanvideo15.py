"""HunyuanVideo 1.5 (``HunyuanVideo15Transformer3DModel``, called as ``HunyuanVideo15Pipeline`` calls it: text-to-video)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

IMAGE_TOKENS = 4  # the pipeline's SigLIP tokens (729 at real size), all zero for text-to-video
BYT5_TOKENS = 8  # ByT5 glyph-text tokens (256 at real size)


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    channels = cfg["out_channels"]
    latents = rand(batch, channels, spec.frames, hw, hw)  # (B, C, F, H, W)
    # text-to-video: the condition latents and their mask, concatenated on channels, are zeros (in = 2 C + 1)
    cond = torch.zeros(batch, cfg["in_channels"] - channels, spec.frames, hw, hw, device=device, dtype=dtype)
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])  # Qwen2.5-VL stream, padded
    # ByT5 stream of a prompt with quoted (glyph) text; without any, the pipeline passes zeros and a zero mask
    text_2 = rand(batch, BYT5_TOKENS, cfg["text_embed_2_dim"])
    # the pipeline casts both masks to the transformer's dtype
    mask = text_mask(batch, spec.text_tokens, device).to(dtype)
    mask_2 = text_mask(batch, BYT5_TOKENS, device).to(dtype)
    image_embeds = torch.zeros(batch, IMAGE_TOKENS, cfg["image_embed_dim"], device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=torch.cat([x, cond], dim=1), image_embeds=image_embeds,
                     timestep=t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text,
                     encoder_attention_mask=mask, encoder_hidden_states_2=text_2, encoder_attention_mask_2=mask_2,
                     return_dict=False)[0]

    return latents, call


FAMILIES = {"hunyuanvideo15": Family(cls="HunyuanVideo15Transformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # in_channels = 2 * out_channels + 1 (latents, condition latents, condition mask); rope axes sum to the head dim
    "tiny-hunyuanvideo15": TransformerSpec(
        "tiny-hunyuanvideo15", "hunyuanvideo15",
        dict(in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=3,
             num_refiner_layers=1, patch_size=1, patch_size_t=1, text_embed_dim=24, text_embed_2_dim=16,
             image_embed_dim=16, rope_axes_dim=(4, 6, 6)),
        4, 6, 2,
    ),
}
