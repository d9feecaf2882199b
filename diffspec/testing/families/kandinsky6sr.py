"""Kandinsky 6 video super-resolution (``Kandinsky6SRTransformer3DModel``, as ``Kandinsky6SRPipeline`` calls it).

Text-free: each call denoises a batch of latent video tiles (channels last, ``(B, T, H, W, C)``), concatenated with a
zero anchor latent and a zero anchor mask. Its self-attention is NABLA sparse attention (a per-row block mask built
from query / key statistics and a sliding-tile prior) on PyTorch's flex attention, which runs eagerly here (the
pipeline's docs advise compiling it at real sizes); the token grid must be a multiple of 8 per side.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    # the pipeline starts each tile from sqrt(1 - s^2) * low-quality latents + s * noise: random here
    latents = rand(batch, frames, hw, hw, cfg["in_visual_dim"])
    # the anchor latent and mask stay zero in plain super-resolution (the scheduler updates only the latents)
    anchor = torch.zeros(batch, frames, hw, hw, cfg["in_visual_dim"] + 1, device=device, dtype=dtype)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # FlowMatchEulerDiscreteScheduler timesteps (1000 * sigma), one per tile; a plain velocity checkpoint
        # (out_visual_dim = in_visual_dim, not PiflowScheduler's widened output), stepped as is
        return model(hidden_states=torch.cat([x, anchor], dim=-1), timestep=t.expand(x.shape[0]),
                     return_dict=False)[0]

    return latents, call


FAMILIES = {"kandinsky6sr": Family(cls="Kandinsky6SRTransformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # head_dim = sum(axes_dims) = 16 (2 heads); 2 frames of 8 x 8 tokens: two 64-token NABLA blocks, a sliding-tile
    # window of one frame (11 released) and threshold 0.1 (0.8), so the block masks are sparse, not all-true; its
    # modulations are not zero-initialised
    "tiny-kandinsky6sr": TransformerSpec(
        "tiny-kandinsky6sr", "kandinsky6sr",
        dict(in_visual_dim=4, out_visual_dim=4, time_dim=32, patch_size=(1, 1, 1), model_dim=32, ff_dim=64,
             num_visual_blocks=3, axes_dims=(4, 6, 6), nabla_window=(1, 7, 7), nabla_threshold=0.1),
        8, 0, 2,
    ),
}
