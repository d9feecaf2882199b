"""EasyAnimate V5.1 (``EasyAnimateTransformer3DModel``, called as ``EasyAnimatePipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    latents = rand(batch, cfg["in_channels"], frames, hw, hw)  # (B, C, F, H, W)
    # Qwen2-VL's second-to-last hidden states, right-padded to max_sequence_length; the pipeline passes no mask
    # (the model builds its RoPE from the latent shape itself)
    text = rand(batch, spec.text_tokens, cfg["text_embed_dim"])

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # FlowMatchEulerDiscreteScheduler timesteps in the latents' dtype, passed positionally
        return model(x, t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text, return_dict=False)[0]

    return latents, call


FAMILIES = {"easyanimate": Family(cls="EasyAnimateTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # head dim 16 = rope axes (t, h, w) of 4, 6, 6; out_channels = in_channels (the output is unpatchified with
    # the input's channels); every block MMDiT (separate text feed-forward), as in the released configs
    "tiny-easyanimate": TransformerSpec(
        "tiny-easyanimate", "easyanimate",
        dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, patch_size=2,
             sample_width=4, sample_height=4, num_layers=3, mmdit_layers=3, time_embed_dim=32, text_embed_dim=24),
        4, 6, 2,
    ),
}
