"""ERNIE-Image (``ErnieImageTransformer2DModel``, called as ``ErnieImagePipeline`` calls it)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, tokens = spec.config, spec.latent_hw, spec.text_tokens
    # (B, 4C, H/2, W/2) noise: the pipeline samples latents already 2x2-patchified into the channels (patch_size 1)
    latents = rand(batch, cfg["in_channels"], hw, hw)
    # _pad_text: each prompt's unpadded states, zero-padded to the longest (here T - 1 and T tokens), and their lengths
    lens = torch.tensor([tokens - (b + 1) % 2 for b in range(batch)], device=device)
    text = rand(batch, tokens, cfg["text_in_dim"])
    text = text * (torch.arange(tokens, device=device) < lens[:, None])[..., None].to(dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # the scheduler's timestep (1000 * sigma) in the latents' dtype, one per row; CFG runs as a doubled batch
        return model(hidden_states=x, timestep=t.expand(x.shape[0]).to(x.dtype), text_bth=text, text_lens=lens,
                     return_dict=False)[0]

    return latents, call


def _init(model: nn.Module) -> None:
    """Random values for the shared adaLN modulation and the output projection, which the class initialises to
    zero (every block would be the identity, the output zero)."""
    model.adaLN_modulation[-1].reset_parameters()
    model.final_linear.reset_parameters()


FAMILIES = {"ernie": Family(cls="ErnieImageTransformer2DModel", make_call=_call, timesteps="flow1000", init=_init)}

SPECS = {
    # one block list over the [image, text] sequence, sequence-first (S, B, D) between blocks (its block profile);
    # sum(rope_axes_dim) = head dim 16; in_channels = 4 latent channels x 2x2 patch
    "tiny-ernie": TransformerSpec(
        "tiny-ernie", "ernie",
        dict(hidden_size=32, num_attention_heads=2, num_layers=3, ffn_hidden_size=64, in_channels=16, out_channels=16,
             patch_size=1, text_in_dim=24, rope_axes_dim=(4, 6, 6)),
        4, 6,
    ),
}
