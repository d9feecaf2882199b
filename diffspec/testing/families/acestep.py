"""ACE-Step 1.5 (``AceStepTransformer1DModel``, as ``AceStepPipeline`` calls it: text-to-music, no CFG).

An audio DiT on channels-last 1-D latents ``(B, T, C)`` (``latent_hw`` is the latent length T), patched by 2 along T;
its self-attention alternates sliding-window and full layers. The condition encoder's packed text / lyrics / timbre
states are the cross-attention context (no mask reaches the transformer).
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, length = spec.config, spec.latent_hw
    acoustic = cfg["audio_acoustic_hidden_dim"]
    latents = rand(batch, length, acoustic)  # prepare_latents: (B, latent_length, acoustic_dim)
    context = rand(batch, spec.text_tokens, cfg["encoder_hidden_size"])  # AceStepConditionEncoder output
    # text2music: the source latents are the condition encoder's learnt silence latent (a fixed tensor: random here),
    # the chunk mask all ones (every frame generated); context_latents = [source, mask] on the channels
    silence = rand(1, length, acoustic).expand(batch, -1, -1)
    context_latents = torch.cat([silence, torch.ones_like(silence)], dim=-1)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # the scheduler (num_train_timesteps=1) passes the shifted sigmas as timesteps, in [0, 1]; timestep_r = t
        # (plain flow matching, not mean flow); the velocity is stepped as is
        timestep = t.expand(x.shape[0]).to(dtype)
        return model(hidden_states=x, timestep=timestep, timestep_r=timestep, encoder_hidden_states=context,
                     context_latents=context_latents, attention_kwargs=None, return_dict=False)[0]

    return latents, call


FAMILIES = {"acestep": Family(cls="AceStepTransformer1DModel", make_call=_call, timesteps="sigma", audio=True)}

SPECS = {
    # sliding / full / sliding self-attention (window 4 of the 8 patched tokens), 2 query heads, 1 KV head;
    # in_channels = 3 * acoustic dim (source, chunk mask, noise); encoder_hidden_size != hidden_size as the XL turbo
    "tiny-acestep": TransformerSpec(
        "tiny-acestep", "acestep",
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
             head_dim=16, in_channels=12, audio_acoustic_hidden_dim=4, patch_size=2, sliding_window=4,
             encoder_hidden_size=24),
        16, 10,
    ),
}
