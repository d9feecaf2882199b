"""SkyReels-V2 (``SkyReelsV2Transformer3DModel``, called as ``SkyReelsV2Pipeline`` calls it: text-to-video)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], spec.frames, hw, hw)  # (B, C, F, H, W)
    # as WanPipeline: no attention mask; the T5 embeddings past the prompt's length are zeroed instead
    text = rand(batch, spec.text_tokens, cfg["text_dim"]) * text_mask(batch, spec.text_tokens, device)[..., None]

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # one timestep per row (not per frame: diffusion forcing is SkyReelsV2DiffusionForcingPipeline's)
        return model(hidden_states=x, timestep=t.expand(x.shape[0]), encoder_hidden_states=text,
                     return_dict=False)[0]

    return latents, call


FAMILIES = {"skyreelsv2": Family(cls="SkyReelsV2Transformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # T2V config: no image embedder, no fps injection (the pipeline passes no fps), one frame per causal block
    "tiny-skyreelsv2": TransformerSpec(
        "tiny-skyreelsv2", "skyreelsv2",
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
             text_dim=24, freq_dim=32, ffn_dim=64, num_layers=3, rope_max_seq_len=32),
        4, 6, 2,
    ),
}
