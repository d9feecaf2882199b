"""MiniMax Music 3 (``MiniMaxMusic3Transformer1DModel``, as the MiniMax Music 3 modular pipeline's denoise loop calls
it: one 200-frame window of flow matching).

An audio DiT on 1-D latents ``(B, C, T)`` (``latent_hw`` is the window's latent length T) conditioned on per-frame
states aligned to the latent timeline (concatenated to the latents' channels, not cross-attended); the timestep
embedding is prepended as one token. The window-overlap blending (the previous window's trailing latents pasted over
the first frames at every step) is left out: this is a first window.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, length = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], length)  # MiniMaxMusic3ChunkPrepareLatentsStep: (B, C, window length)
    condition = rand(batch, length, cfg["condition_dim"])  # MiniMaxMusic3ConditionEncoder output, frame-aligned

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # flow-matching time in [0, 1] with 0 = noise (the scheduler's inverted sigmas 1 .. 1/n): 1 - sigma, growing
        # over sampling; the model predicts data - noise, negated into the loop's velocity. The guider's
        # unconditional branch (zero condition) is a second call at the same timestep.
        timestep = (1 - t.expand(x.shape[0])).to(dtype)
        return -model(hidden_states=x, timestep=timestep, encoder_hidden_states=condition, return_dict=False)[0]

    return latents, call


FAMILIES = {"minimaxmusic3": Family(cls="MiniMaxMusic3Transformer1DModel", make_call=_call, timesteps="sigma", audio=True)}

SPECS = {
    # head dim 16, rotary over its first 8 channels (32 of 64 released); plain pre-norm blocks (no adaLN: the
    # timestep enters as the prepended token)
    "tiny-minimaxmusic3": TransformerSpec(
        "tiny-minimaxmusic3", "minimaxmusic3",
        dict(in_channels=4, condition_dim=24, num_layers=3, num_attention_heads=2, attention_head_dim=16,
             ff_inner_dim=64, rotary_dim=8, fourier_embedding_dim=32),
        16,
    ),
}
