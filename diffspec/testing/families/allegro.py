"""Allegro (``AllegroTransformer3DModel``, called as ``AllegroPipeline`` calls it: its own 3-axis RoPE)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    cfg, hw, frames = spec.config, spec.latent_hw, spec.frames
    latents = rand(batch, cfg["in_channels"], frames, hw, hw)  # (B, C, F, H, W)
    # T5 states padded to max_sequence_length and the tokenizer's 0/1 mask (the model turns it into a bias)
    text, mask = rand(batch, spec.text_tokens, cfg["caption_channels"]), text_mask(batch, spec.text_tokens, device)
    # AllegroPipeline._prepare_rotary_positional_embeddings: per-axis (cos, sin) tables and the tokens' (t, h, w)
    # positions, shape (3, 1, F * H/p * W/p), no batch dimension
    grid = hw // cfg["patch_size"]
    freqs_t, freqs_h, freqs_w, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=cfg["attention_head_dim"], crops_coords=((0, 0), (grid, grid)), grid_size=(grid, grid),
        temporal_size=frames, interpolation_scale=(cfg["interpolation_scale_t"], cfg["interpolation_scale_h"],
                                                   cfg["interpolation_scale_w"]), device=device)
    pos = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long())
    pos = pos.reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1).contiguous()
    rope = ((freqs_t, freqs_h, freqs_w), tuple(pos))

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # discrete 0..999 timesteps (EulerAncestralDiscreteScheduler); its scale_model_input is the scheduler's
        return model(hidden_states=x, encoder_hidden_states=text, encoder_attention_mask=mask,
                     timestep=t.expand(x.shape[0]), image_rotary_emb=rope, return_dict=False)[0]

    return latents, call


FAMILIES = {"allegro": Family(cls="AllegroTransformer3DModel", make_call=_call, timesteps="ddpm")}

SPECS = {
    # the RoPE splits each head into (t, h, w) thirds of even width: head dim 18; cross_attention_dim = the
    # inner dim (captions are projected to it); sample_* only size the unused positional table
    "tiny-allegro": TransformerSpec(
        "tiny-allegro", "allegro",
        dict(patch_size=2, patch_size_t=1, num_attention_heads=2, attention_head_dim=18, in_channels=4,
             out_channels=4, num_layers=3, cross_attention_dim=36, sample_height=4, sample_width=4,
             sample_frames=2, caption_channels=24, interpolation_scale_h=2.0, interpolation_scale_w=2.0,
             interpolation_scale_t=2.2),
        4, 6, 2,
    ),
}
