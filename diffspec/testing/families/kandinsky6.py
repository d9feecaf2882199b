"""Kandinsky 6 (``Kandinsky6Transformer3DModel``, as ``Kandinsky6TI2VAPipeline`` calls it: text-to-video-and-audio).

Two text-encoder lists (video and audio branches) run first; their outputs are the fused blocks' cross-attention
contexts. Each fused block transforms video (``vis``) and audio (``aud``) and returns both; the transformer returns
(video, audio) predictions. ``call`` advances only the video latents: the audio latents stay the same random noise at
every step (the pipeline denoises them too, with a copy of the scheduler), as in ``ltx2``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

AUDIO_FRAMES = 5  # audio latent length (the pipeline: from the video's duration, sample rate and hop length)


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    c = cfg["in_visual_dim"]
    latents = rand(batch, frames, hw, hw, c)  # channels last: (B, F, H, W, C), as prepare_latents
    audio = rand(batch, AUDIO_FRAMES, cfg["in_audio_dim"])  # prepare_audio_latents: (B, L, C); fixed (docstring)
    # Qwen2.5-VL tokens padded to max_sequence_length with their boolean padding mask (dropped only when nothing is
    # padded); CLIP pooled
    text = rand(batch, spec.text_tokens, cfg["in_text_dim"])
    mask = text_mask(batch, spec.text_tokens, device).bool()
    pooled = rand(batch, cfg["in_text_dim2"])
    # text-to-video: no reference frame, so visual_rope_pos / visual_token_type_ids stay None; visual_cond models take
    # [noise, zero condition, zero mask] channels
    cond = torch.zeros(batch, frames, hw, hw, c + 1, device=device, dtype=dtype) if cfg.get("visual_cond") else None

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        hidden = x if cond is None else torch.cat([x, cond], dim=-1)
        # FlowMatchEulerDiscreteScheduler timesteps (1000 * sigma), one per row
        return model(hidden_states=hidden, audio_hidden_states=audio, encoder_hidden_states=text,
                     pooled_projections=pooled, timestep=t.expand(x.shape[0]).to(dtype), visual_rope_pos=None,
                     encoder_attention_mask=mask, visual_token_type_ids=None, return_dict=False)[0]

    return latents, call


FAMILIES = {"kandinsky6": Family(cls="Kandinsky6Transformer3DModel", make_call=_call, timesteps="flow1000")}

SPECS = {
    # head_dim = sum(axes_dims) = 16 (2 heads of the 32-wide video and audio streams; ca_rope needs equal video and
    # audio head dims); the released configs' ca_rope / cross_gates / fix_modulation / text_token_padding; its
    # modulations are not zero-initialised (no Family.init needed)
    "tiny-kandinsky6": TransformerSpec(
        "tiny-kandinsky6", "kandinsky6",
        dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=24, in_text_dim2=16, time_dim=32, patch_size=(1, 2, 2),
             model_dim=32, ff_dim=64, num_text_blocks=2, num_visual_blocks=3, axes_dims=(4, 6, 6), visual_cond=True,
             in_audio_dim=4, out_audio_dim=4, text_token_padding=True, ca_rope=True, cross_gates=True,
             fix_modulation=True),
        4, 6, 2,
    ),
}
