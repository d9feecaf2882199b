"""LongCat-Image (``LongCatImageTransformer2DModel``, called as ``LongCatImagePipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    # _pack_latents: (B, C, H, W) noise packed in 2x2 patches to (B, (H/2)*(W/2), 4C) tokens of iid noise
    latents = rand(batch, hw * hw, cfg["in_channels"])
    # Qwen2.5-VL states of the prompt padded to tokenizer_max_length (here T), template tokens cut; no mask passed
    text = rand(batch, tokens, cfg["joint_attention_dim"])
    # prepare_pos_ids without a batch dimension: text (0, i, i); image (1, T + h, T + w), starting after the
    # tokenizer_max_length text positions
    txt_ids = torch.zeros(tokens, 3)
    txt_ids[:, 1] = txt_ids[:, 2] = torch.arange(tokens)
    img_ids = torch.cartesian_prod(torch.ones(1), torch.arange(hw) + float(tokens), torch.arange(hw) + float(tokens))
    txt_ids, img_ids = txt_ids.to(device), img_ids.to(device)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # timestep / 1000 = sigma (the model multiplies by 1000); guidance=None (not embedded); CFG calls once per
        # branch (cfg renorm acts on the outputs)
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(x.dtype), guidance=None,
                     encoder_hidden_states=text, txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]

    return latents, call


FAMILIES = {"longcat": Family(cls="LongCatImageTransformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # Flux-like: dual-stream then single-stream blocks; sum(axes_dims_rope) = head dim; in_channels = 4 x 2x2 patch
    "tiny-longcat": TransformerSpec(
        "tiny-longcat", "longcat",
        dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=24, pooled_projection_dim=24, axes_dims_rope=[4, 6, 6]),
        4, 6,
    ),
}
