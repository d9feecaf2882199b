"""Z-Image (``ZImageTransformer2DModel``, ``ZImagePipeline``): a tiny random-weight config and its call."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], hw, hw)
    # ZImagePipeline passes a list of per-prompt caption features: each prompt's unpadded tokens (mask applied)
    text, mask = rand(batch, spec.text_tokens, cfg["cap_feat_dim"]), text_mask(batch, spec.text_tokens, device).bool()
    caps = [text[i][mask[i]] for i in range(batch)]

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        timestep = (1000 - t.expand(x.shape[0])) / 1000  # 0 = noise, 1 = image: it grows over sampling
        images = list(x.unsqueeze(2).unbind(0))  # one (C, F=1, H, W) tensor per row
        out = model(images, timestep, caps, return_dict=False)[0]  # a list again
        return -torch.stack(out).squeeze(2)  # the pipeline negates the prediction before the scheduler step

    return latents, call


FAMILIES = {"zimage": Family(cls="ZImageTransformer2DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # rope axes sum to the head dim (32 / 2 heads); axes_lens bound the positions: captions (padded to 32 tokens)
    # take frame positions 1..32, the image frame 33. Image and caption tokens are each padded to a multiple of 32.
    "tiny-zimage": TransformerSpec(
        "tiny-zimage", "zimage",
        dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=3, n_refiner_layers=2,
             n_heads=2, n_kv_heads=2, cap_feat_dim=24, axes_dims=(4, 6, 6), axes_lens=(64, 16, 16)),
        8, 6,
    ),
}
