"""Stable Audio Open (``StableAudioDiTModel``, as ``StableAudioPipeline`` calls it: text-to-audio).

An audio DiT on 1-D latents ``(B, C, T)`` (``latent_hw`` is the latent length T). A global token (the start / end
seconds embeddings plus the timestep embedding) is prepended to the sequence; the prompt states and the two seconds
embeddings are the cross-attention context. The scheduler's input scaling (``scale_model_input``, EDM's c_in) is not
applied: the latents are passed as the loop holds them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    cfg, length = spec.config, spec.latent_hw
    latents = rand(batch, cfg["in_channels"], length)  # prepare_latents: (B, C, sample_size)
    dim = cfg["cross_attention_input_dim"]  # the projection model's conditioning_dim
    # T5 states (projected), zeroed past the prompt's length; no mask reaches the transformer
    prompt = rand(batch, spec.text_tokens, dim) * text_mask(batch, spec.text_tokens, device)[..., None]
    start, end = rand(batch, 1, dim), rand(batch, 1, dim)  # the seconds_start / seconds_end number embeddings
    context = torch.cat([prompt, start, end], dim=1)  # text_audio_duration_embeds
    global_states = torch.cat([start, end], dim=2)  # audio_duration_embeds: (B, 1, 2 * conditioning_dim)
    # partial rotary (half the head dim) over the prepended global token and the latents, no batch dimension
    rotary = get_1d_rotary_pos_embed(cfg["attention_head_dim"] // 2, length + global_states.shape[1], use_real=True,
                                     repeat_interleave_real=False)
    rotary = tuple(r.to(device) for r in rotary)

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # CosineDPMSolverMultistepScheduler timesteps atan(sigma) * 2 / pi (0..1, decreasing), passed as t.unsqueeze(0):
        # one entry for the whole batch; v-prediction, stepped as is
        return model(x, t.reshape(1), encoder_hidden_states=context, global_hidden_states=global_states,
                     rotary_embedding=rotary, return_dict=False)[0]

    return latents, call


FAMILIES = {"stableaudio": Family(cls="StableAudioDiTModel", make_call=_call, timesteps="sigma", audio=True)}

SPECS = {
    # grouped-query cross-attention (2 query heads, 1 KV head) as the released 24 / 12; global_states_input_dim =
    # 2 * cross_attention_input_dim (start and end seconds embeddings side by side); 16 latent frames
    "tiny-stableaudio": TransformerSpec(
        "tiny-stableaudio", "stableaudio",
        dict(sample_size=16, in_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2,
             num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=32, time_proj_dim=32,
             global_states_input_dim=48, cross_attention_input_dim=24),
        16, 6,
    ),
}
