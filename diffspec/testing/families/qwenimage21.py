"""Qwen-Image 2.1 (``QwenImage21Transformer2DModel``, called as ``QwenImage21Pipeline`` calls it with
``use_kv_cache=False``: the prefix KV cache is refused by the hooks, see its row in :mod:`diffspec.forecast.profiles`)."""

from __future__ import annotations

import torch
from torch import nn

from ..transformer_spec import Call, Family, Rand, TransformerSpec, text_mask

SLOT_TOKENS = 4  # each vision-language image slot of img_mask stands for a 2x2 group of latent tokens


def _call(spec: TransformerSpec, batch: int, rand: Rand, device: str | torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, Call]:
    cfg, hw = spec.config, spec.latent_hw
    tokens = hw * hw
    latents = rand(batch, tokens, cfg["in_channels"])  # unpatched latents, a plain spatial flatten (B, H*W, C)
    # Qwen2.5-VL states zero-padded to the longest prompt, and their mask (dropped only when nothing is padded)
    text = rand(batch, spec.text_tokens, cfg["context_in_dim"])
    mask = text_mask(batch, spec.text_tokens, device)
    text = text * mask[..., None].to(dtype)
    # img_mask: the prompt's image slots (none: text-to-image), padded positions False, then one slot per 2x2
    # group of target latents (append_target_slots)
    img_mask = torch.cat([torch.zeros(batch, spec.text_tokens, dtype=torch.bool, device=device),
                          torch.ones(batch, tokens // SLOT_TOKENS, dtype=torch.bool, device=device)], dim=1)
    img_shapes = [[(1, hw, hw)]] * batch  # condition images first (none), the target last

    def call(model: nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # timestep / 1000 = sigma; the output spans the joint text + image sequence: the pipeline keeps the target
        out = model(hidden_states=x, timestep=t.expand(x.shape[0]).to(x.dtype), encoder_hidden_states=text,
                    encoder_hidden_states_mask=mask, img_shapes=img_shapes, img_mask=img_mask, return_dict=False)[0]
        return out[:, -x.shape[1]:]

    return latents, call


FAMILIES = {"qwenimage21": Family(cls="QwenImage21Transformer2DModel", make_call=_call, timesteps="sigma")}

SPECS = {
    # one joint single-stream block list; causal_condition (the default): text tokens modulate from t = 0, the
    # blocks get B + 1 modulation rows (rows.py: TRAILING_SHARED_ARGS). Target tokens (hw^2) a multiple of 4.
    "tiny-qwenimage21": TransformerSpec(
        "tiny-qwenimage21", "qwenimage21",
        dict(patch_size=1, in_channels=4, out_channels=4, num_layers=3, attention_head_dim=16, num_attention_heads=2,
             context_in_dim=24, axes_dims_rope=(4, 6, 6)),
        4, 6,
    ),
}
