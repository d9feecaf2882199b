"""Nucleus-Image MoE (``NucleusMoEImageTransformer2DModel``, called as ``NucleusMoEImagePipeline`` calls it)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, hw * hw, cfg["in_channels"])  # packed 2x2 patches of the latent (patch_size=2)
    # a hidden layer of the text encoder (padded to a multiple of 8, pad positions not zeroed) and its mask; the
    # pipeline drops the mask only when nothing is padded
    text = rand(batch, spec.text_tokens, cfg["joint_attention_dim"])
    mask = text_mask(batch, spec.text_tokens, device)
    img_shapes = [(1, hw, hw)] * batch  # (frames, packed h, packed w) per sample: the rotary table

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = model(hidden_states=x, timestep=t.expand(x.shape[0]).to(dtype), encoder_hidden_states=text,
                    encoder_hidden_states_mask=mask, img_shapes=img_shapes, return_dict=False)[0]
        return -out  # the pipeline negates the prediction before the scheduler step

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the routed experts' packed weights, which the class leaves uninitialised (``torch.empty``):
    the uniform init of a linear layer of that fan-in."""
    for module in model.modules():
        if type(module).__name__ == "SwiGLUExperts":
            for weight in (module.gate_up_proj, module.down_proj):
                bound = 1 / math.sqrt(weight.shape[1])
                nn.init.uniform_(weight, -bound, bound)


FAMILIES = {"nucleusmoe": Family(cls="NucleusMoEImageTransformer2DModel", make_call=_call, timesteps="sigma",
                                 init=_init)}

SPECS = {
    # in_channels = 4 latent channels x 2x2 patch; out_channels 4 (the output is packed like the input). Block 0 dense
    # (mlp_ratio 6: the dense MLP's width rounds down to a multiple of 128), blocks 1-2 MoE: 4 experts with
    # expert-choice routing (capacity 2 * 16 tokens / 4 experts = 8 tokens each) and a shared expert
    "tiny-nucleusmoe": TransformerSpec(
        "tiny-nucleusmoe", "nucleusmoe",
        dict(patch_size=2, in_channels=16, out_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2,
             joint_attention_dim=24, axes_dims_rope=(4, 6, 6), mlp_ratio=6.0, moe_enabled=True,
             dense_moe_strategy="leave_first_block_dense", num_experts=4, moe_intermediate_dim=32,
             capacity_factors=2.0),
        4, 8,
    ),
}
