"""Stable Audio 3 (``StableAudio3DiTModel``, as ``StableAudio3Pipeline`` calls it: text-to-audio, rectified flow).

An audio DiT on 1-D latents ``(B, C, T)`` (``latent_hw`` is the latent length T) with learnt memory tokens prepended
inside the model. The duration embedding is both the global (AdaLN) input and an extra cross-attention token after
the prompt's.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, length = spec.config, spec.latent_hw
    latents = rand(batch, cfg["io_channels"], length)  # prepare_latents: (B, latent_dim, latent_length)
    prompt = rand(batch, spec.text_tokens, cfg["cond_token_dim"])  # T5Gemma states, padded
    mask = text_mask(batch, spec.text_tokens, device)
    duration = rand(batch, cfg["global_cond_dim"])  # StableAudio3DurationEmbedder output: (B, global_cond_dim)
    # prepare_cross_attention: the duration embedding as one more (valid) context token
    context = torch.cat([prompt, duration.unsqueeze(1)], dim=1)
    context_mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # FlowMatchEulerDiscreteScheduler timesteps on its log-SNR sigma schedule, in [0, 1] as the model takes them,
        # expanded to the batch; the velocity is stepped as is
        return model(x, t.expand(x.shape[0]), encoder_hidden_states=context, global_hidden_states=duration,
                     encoder_attention_mask=context_mask, return_dict=False)[0]

    return latents, call


FAMILIES = {"stableaudio3": Family(cls="StableAudio3DiTModel", make_call=_call, timesteps="sigma", audio=True)}

SPECS = {
    # differential attention (the default); 4 memory tokens (64 released); global_cond_dim = cond_token_dim (the
    # duration embedding is also a context token); head dim 16, rotary over its first 8 channels
    "tiny-stableaudio3": TransformerSpec(
        "tiny-stableaudio3", "stableaudio3",
        dict(io_channels=4, patch_size=1, embed_dim=32, depth=3, num_heads=2, cond_token_dim=24, global_cond_dim=24,
             local_add_cond_dim=5, timestep_features_dim=32, ff_mult=2.0, num_memory_tokens=4),
        16, 6,
    ),
}
